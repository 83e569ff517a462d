// The engine-side queue, admission and iteration planning. See batcher.hpp.
#include "bench/run/batcher.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "scheduler/shared_prefixes.hpp"

namespace kvtier::bench::run {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

Batcher::Batcher(const Workload& workload, const BatcherConfig& config, BaselineResult& result,
                 std::atomic<uint64_t>* progress)
    : workload_(workload),
      config_(config),
      result_(result),
      progress_(progress),
      held_(config.layers) {
  budget_frames_ =
      static_cast<uint64_t>(config.admit_fraction * static_cast<double>(config.hbm_frames));
  result_.records.resize(workload.requests.size());
  for (std::size_t i = 0; i < workload.requests.size(); ++i) {
    const Request& r = workload.requests[i];
    RequestRecord& rec = result_.records[i];
    rec.kind = r.kind;
    rec.arrival = r.arrival;
    rec.input_tokens = r.input_tokens;
    rec.output_tokens = r.output_tokens;
  }
}

std::optional<Nanos> Batcher::next_arrival() const {
  if (next_ >= workload_.requests.size()) return std::nullopt;
  return workload_.requests[next_].arrival;
}

void Batcher::take_arrivals(Nanos now) {
  while (next_ < workload_.requests.size() && workload_.requests[next_].arrival <= now) {
    waiting_.push_back(next_++);
    hints_dirty_ = true;
  }
}

void Batcher::finish_one() {
  ++finished_;
  if (progress_ != nullptr) progress_->fetch_add(1, std::memory_order_relaxed);
}

Status Batcher::admit(const OpenFn& open, Nanos now) {
  const uint32_t pt = config_.page_tokens;
  while (!waiting_.empty() && running_.size() < config_.max_sequences) {
    const std::size_t i = waiting_.front();
    const Request& req = workload_.requests[i];
    const uint64_t pages = ceil_div(req.input_tokens + req.output_tokens, pt);
    const uint64_t frames = pages * config_.layers;
    std::span<const BlockKey> keys;
    if (config_.reuse) keys = std::span(req.keys).first(req.prompt_blocks(pt));
    if (frames > budget_frames_) {
      // Larger than HBM: only a layer window streamed through HBM can run it, which needs a host
      // tier to stream from, one layer that fits, and the GPU to itself.
      const bool can = config_.host_frames > 0 && pages <= budget_frames_ &&
                       frames <= config_.host_frames + config_.hbm_frames;
      if (!can) {
        result_.records[i].rejected = true;
        waiting_.pop_front();
        hints_dirty_ = true;
        finish_one();
        continue;
      }
      if (!running_.empty()) break;
    } else if (held_.frames() + held_.estimate(keys, pages) > budget_frames_) {
      break;
    }
    waiting_.pop_front();
    hints_dirty_ = true;
    LiveRequest live;
    live.index = i;
    live.req = &req;
    auto opened = open(keys);
    if (!opened.ok()) {
      return opened.status().with_context("open_sequence of request " + std::to_string(req.id));
    }
    live.seq = opened->id;
    live.ctx = opened->reused_tokens;
    live.reused_blocks = opened->reused_blocks;
    live.admitted = now;
    live.holding = config_.hold_nvme && opened->reused_by_tier[tier_index(Tier::kNvme)] > 0;
    live.prompt_left = req.input_tokens - std::min(req.input_tokens, opened->reused_tokens);
    RequestRecord& rec = result_.records[i];
    for (Tier t : kAllTiers) {
      rec.reused_tokens[tier_index(t)] =
          static_cast<uint64_t>(opened->reused_by_tier[tier_index(t)]) * pt;
    }
    live.share = held_.add(keys, opened->reused_blocks, pages);
    live.computed_blocks = std::min<uint64_t>(opened->reused_blocks, keys.size());
    running_.push_back(std::move(live));
  }
  return ok_status();
}

std::vector<HintedRequest> Batcher::hints(Nanos now, double prefill_tokens_per_s,
                                          std::size_t window) {
  hints_dirty_ = false;
  std::vector<HintedRequest> out;
  Nanos start = now;
  const double rate = std::max(1.0, prefill_tokens_per_s);
  for (std::size_t i : waiting_) {
    if (out.size() >= window) break;
    const Request& req = workload_.requests[i];
    HintedRequest h;
    h.request_id = req.id + 1;  // 0 is not an id
    h.expected_start_ns = start;
    const auto n = static_cast<std::ptrdiff_t>(req.prompt_blocks(config_.page_tokens));
    h.keys.assign(req.keys.begin(), req.keys.begin() + n);
    out.push_back(std::move(h));
    // Requests start one after another, each after the prefill of the one before.
    start += static_cast<Nanos>(static_cast<double>(req.input_tokens) / rate * 1e9);
  }
  return out;
}

std::size_t Batcher::hold(const std::function<bool(const LiveRequest&)>& ready, Nanos now,
                          Nanos max_hold) {
  std::size_t runnable = 0;
  for (LiveRequest& r : running_) {
    if (r.holding && (now - r.admitted >= max_hold || ready(r))) r.holding = false;
    if (!r.holding) ++runnable;
  }
  return runnable;
}

bool Batcher::windowed_batch() const {
  std::vector<uint64_t> pages;
  std::vector<std::span<const BlockKey>> prompts;  // the prompt blocks each one reads
  for (const LiveRequest& r : running_) {
    if (r.holding) continue;
    const uint64_t add = std::min<uint64_t>(r.prompt_left, config_.max_batched_tokens) + 1;
    pages.push_back(ceil_div(r.ctx + add, config_.page_tokens));
    const uint64_t keyed = config_.reuse ? r.req->prompt_blocks(config_.page_tokens) : 0;
    prompts.push_back(std::span(r.req->keys).first(std::min(pages.back(), keyed)));
  }
  const std::vector<uint32_t> shared = shared_prefix_lengths(prompts);
  uint64_t frames = 0;
  for (std::size_t i = 0; i < pages.size(); ++i) frames += pages[i] - shared[i];
  return frames * config_.layers > config_.hbm_frames;
}

StepPlan Batcher::plan(Nanos now, uint32_t max_iterations, const CostFn& cost) {
  StepPlan plan;
  const Nanos next = next_arrival().value_or(std::numeric_limits<Nanos>::max());
  for (LiveRequest& r : running_) {
    r.step_new = 0;
    r.ctx_before = r.ctx;
    r.first_iteration = r.last_iteration = -1;
  }
  for (uint32_t it = 0; it < std::max<uint32_t>(1, max_iterations); ++it) {
    IterationWork w;
    bool finished_any = false;
    const int iter = static_cast<int>(it);
    const auto produced = [&](LiveRequest& r) {
      if (r.out_done == 1) r.first_iteration = iter;
      if (r.out_done >= r.req->output_tokens) {
        r.done = true;
        r.last_iteration = iter;
        finished_any = true;
      }
    };
    for (LiveRequest& r : running_) {
      if (r.done || r.holding || r.prompt_left > 0) continue;
      w.decode_tokens += 1;
      w.decode_context += r.ctx;
      r.ctx += 1;
      r.step_new += 1;
      r.out_done += 1;
      produced(r);
    }
    uint64_t budget = config_.max_batched_tokens > w.decode_tokens
                          ? config_.max_batched_tokens - w.decode_tokens
                          : 0;
    for (LiveRequest& r : running_) {
      if (budget == 0) break;
      if (r.done || r.holding || r.prompt_left == 0) continue;
      const uint64_t chunk = std::min(r.prompt_left, budget);
      w.prefill_tokens += chunk;
      w.prefill_pairs += chunk_pairs(r.ctx, chunk);
      w.prefill_context += r.ctx;
      r.ctx += chunk;
      r.step_new += chunk;
      r.prompt_left -= chunk;
      budget -= chunk;
      if (r.prompt_left == 0) {
        r.out_done = 1;  // the prompt's last chunk yields the first output token
        produced(r);
      }
    }
    if (w.tokens() == 0) break;
    plan.model_time += cost(w);
    plan.prefill_tokens += w.prefill_tokens;
    plan.iterations.push_back(w);
    plan.ends.push_back(plan.model_time);
    const bool all_done = std::all_of(running_.begin(), running_.end(),
                                      [](const LiveRequest& r) { return r.done || r.holding; });
    if (all_done || now + plan.model_time >= next || (finished_any && !waiting_.empty())) break;
  }
  for (LiveRequest& r : running_) {
    if (r.step_new == 0) continue;
    plan.items.push_back(StepItem{r.seq, static_cast<uint32_t>(r.step_new)});
    plan.requests.push_back(&r);
  }
  return plan;
}

Result<IterationWork> Batcher::accept(const StepPlan& plan, const StepInfo& info) {
  IterationWork extra;
  if (info.items.size() != plan.items.size()) {
    return internal_error("step " + std::to_string(info.id) + " has " +
                          std::to_string(info.items.size()) + " items; the engine asked for " +
                          std::to_string(plan.items.size()));
  }
  for (std::size_t i = 0; i < info.items.size(); ++i) {
    const StepItemInfo& it = info.items[i];
    LiveRequest& r = *plan.requests[i];
    if (it.sequence != r.seq || it.context_tokens + it.recomputed_tokens != r.ctx_before) {
      return internal_error(
          "step " + std::to_string(info.id) + ": item " + std::to_string(i) + " (sequence " +
          std::to_string(it.sequence) + ") starts at " + std::to_string(it.context_tokens) + " + " +
          std::to_string(it.recomputed_tokens) + " recomputed tokens; the engine counted " +
          std::to_string(r.ctx_before) + " for sequence " + std::to_string(r.seq));
    }
    if (it.recomputed_tokens == 0) continue;
    extra.prefill_tokens += it.recomputed_tokens;
    extra.prefill_pairs += chunk_pairs(it.context_tokens, it.recomputed_tokens);
    extra.prefill_context += it.context_tokens;
    extra.recompute_tokens += it.recomputed_tokens;
    // Counted as hits at open, computed after all: take them back, slowest tier first.
    uint64_t give_back = it.recomputed_tokens;
    RequestRecord& rec = result_.records[r.index];
    for (Tier t : {Tier::kNvme, Tier::kHost, Tier::kHbm}) {
      const uint64_t take = std::min(give_back, rec.reused_tokens[tier_index(t)]);
      rec.reused_tokens[tier_index(t)] -= take;
      give_back -= take;
    }
  }
  return extra;
}

std::vector<StepCompletion> Batcher::completions(const StepPlan& plan, const StepInfo& info) const {
  std::vector<StepCompletion> out;
  if (!config_.reuse) return out;
  const uint32_t pt = config_.page_tokens;
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    const LiveRequest& r = *plan.requests[i];
    const uint64_t first = info.items[i].context_tokens / pt;
    const uint64_t full = std::min<uint64_t>(r.ctx / pt, r.req->keys.size());
    if (full <= first) continue;
    StepCompletion c;
    c.sequence = r.seq;
    c.full_block_keys.assign(r.req->keys.begin() + static_cast<std::ptrdiff_t>(first),
                             r.req->keys.begin() + static_cast<std::ptrdiff_t>(full));
    out.push_back(std::move(c));
  }
  return out;
}

Status Batcher::complete(const StepPlan& plan, Nanos end,
                         const std::function<Status(SequenceId, uint64_t)>& close) {
  const auto at = [&](int iteration) {
    return end - (plan.model_time - plan.ends[static_cast<std::size_t>(iteration)]);
  };
  for (LiveRequest* r : plan.requests) {
    RequestRecord& rec = result_.records[r->index];
    if (r->first_iteration >= 0) rec.first_token = at(r->first_iteration);
    if (r->last_iteration >= 0) rec.finish = at(r->last_iteration);
    if (config_.reuse) {
      const uint64_t full = std::min<uint64_t>(r->ctx / config_.page_tokens,
                                               r->req->prompt_blocks(config_.page_tokens));
      if (full > r->computed_blocks) {
        held_.computed(
            std::span(r->req->keys).subspan(r->computed_blocks, full - r->computed_blocks));
        r->computed_blocks = full;
      }
    }
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    KVTIER_RETURN_IF_ERROR(close(it->seq, it->out_done).with_context("close_sequence"));
    held_.remove(it->share);
    finish_one();
    it = running_.erase(it);
  }
  return ok_status();
}

}  // namespace kvtier::bench::run
