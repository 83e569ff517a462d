#include "bench/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "bench/engine/ops.hpp"

namespace kvtier::engine {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

std::string request_name(const Request& r) { return "request " + std::to_string(r.id); }

}  // namespace

struct ReferenceEngine::Running {
  Request request;
  SequenceId sequence = 0;
  std::vector<uint32_t> tokens;  // the prompt, then each generated token once sampled
  uint64_t written = 0;          // tokens whose K/V the runtime holds for this sequence
  std::vector<BlockKey> keys;    // keys of the full blocks of tokens[0, written)
  RequestOutput out;
};

ReferenceEngine::ReferenceEngine(Runtime& runtime, std::shared_ptr<const Weights> weights,
                                 EngineOptions options, PagedAttention attention)
    : runtime_(runtime),
      weights_(std::move(weights)),
      options_(options),
      attention_(std::move(attention)),
      arena_(std::make_unique<tbb::task_arena>(
          options.threads == 0 ? tbb::task_arena::automatic : static_cast<int>(options.threads))),
      hbm_(runtime.hbm_view()) {}

Result<std::unique_ptr<ReferenceEngine>> ReferenceEngine::create(
    Runtime& runtime, std::shared_ptr<const Weights> weights, EngineOptions options) {
  if (weights == nullptr) return invalid_argument("reference engine: no model weights");
  const Geometry& g = runtime.geometry();
  if (options.max_running == 0) {
    return invalid_argument("reference engine: max_running must be at least 1");
  }
  if (options.prefill_chunk == 0 || options.prefill_chunk % g.page_tokens != 0) {
    return invalid_argument(
        "reference engine: prefill_chunk " + std::to_string(options.prefill_chunk) +
        " must be a positive multiple of page_tokens " + std::to_string(g.page_tokens) +
        " (prompt blocks are always computed as whole pages)");
  }
  if (options.max_step_tokens < options.max_running + g.page_tokens) {
    return invalid_argument("reference engine: max_step_tokens " +
                            std::to_string(options.max_step_tokens) +
                            " must hold a decode token per running sequence and one page of "
                            "prompt (at least " +
                            std::to_string(options.max_running + g.page_tokens) + ")");
  }
  if (options.kv_shadow != nullptr && !(options.kv_shadow->geometry() == g)) {
    return invalid_argument(
        "reference engine: the kv_shadow was made for another geometry than the runtime's");
  }
  KVTIER_ASSIGN_OR_RETURN(
      PagedAttention attention,
      PagedAttention::create(weights->shape, g, runtime.hbm_view(), options.isa));
  return std::unique_ptr<ReferenceEngine>(
      new ReferenceEngine(runtime, std::move(weights), options, std::move(attention)));
}

ReferenceEngine::~ReferenceEngine() {
  for (const auto& seq : running_) {
    runtime_.close_sequence(seq->sequence).ignore();
    if (options_.kv_shadow) options_.kv_shadow->close(seq->sequence);
  }
}

bool ReferenceEngine::done() const {
  return pending_.empty() && waiting_.empty() && running_.empty();
}

Status ReferenceEngine::submit(Request request) {
  const ModelShape& shape = weights_->shape;
  if (request.prompt.empty()) return invalid_argument(request_name(request) + ": empty prompt");
  if (request.max_new_tokens == 0) {
    return invalid_argument(request_name(request) + ": max_new_tokens must be at least 1");
  }
  for (std::size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] >= shape.vocab) {
      return invalid_argument(request_name(request) + ": prompt token " + std::to_string(i) +
                              " is " + std::to_string(request.prompt[i]) +
                              ", outside the vocabulary of " + std::to_string(shape.vocab));
    }
  }
  if (std::find(submitted_ids_.begin(), submitted_ids_.end(), request.id) != submitted_ids_.end()) {
    return invalid_argument(request_name(request) + " was already submitted");
  }
  // The last generated token is never fed back, so its K/V is never written.
  const uint64_t longest = request.prompt.size() + request.max_new_tokens - 1;
  const uint64_t pages = ceil_div(longest, runtime_.geometry().page_tokens);
  if (pages > hbm_.frames) {
    return resource_exhausted(request_name(request) + ": " + std::to_string(longest) +
                              " tokens need " + std::to_string(pages) +
                              " HBM frames per layer; the arena has " +
                              std::to_string(hbm_.frames));
  }
  submitted_ids_.push_back(request.id);
  pending_.push_back(std::move(request));
  return ok_status();
}

Status ReferenceEngine::admit_arrivals() {
  bool queue_changed = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->arrival_step <= step_no_) {
      waiting_.push_back(std::move(*it));
      it = pending_.erase(it);
      queue_changed = true;
    } else {
      ++it;
    }
  }
  while (running_.size() < options_.max_running && !waiting_.empty()) {
    Request& req = waiting_.front();
    // Every full block but the one holding the prompt's last token: that token is always computed,
    // since its logits choose the first generated token.
    const std::vector<BlockKey> prompt_keys =
        runtime_.block_keys(std::span(req.prompt.data(), req.prompt.size() - 1));
    auto opened = runtime_.open_sequence(prompt_keys);
    if (!opened.ok()) {
      return std::move(opened).status().with_context("reference engine: admitting " +
                                                     request_name(req));
    }
    auto seq = std::make_unique<Running>();
    seq->sequence = opened->id;
    seq->tokens = req.prompt;
    seq->written = opened->reused_tokens;
    seq->keys.assign(prompt_keys.begin(), prompt_keys.begin() + opened->reused_blocks);
    seq->out.id = req.id;
    seq->out.prompt_tokens = req.prompt.size();
    seq->out.reused_tokens = opened->reused_tokens;
    seq->out.reused_by_tier = opened->reused_by_tier;
    seq->out.admitted_step = step_no_;
    if (options_.kv_shadow) {
      options_.kv_shadow->open(seq->sequence, std::span(prompt_keys.data(), opened->reused_blocks));
    }
    stats_.prompt_tokens += req.prompt.size();
    stats_.reused_tokens += opened->reused_tokens;
    seq->request = std::move(req);
    waiting_.pop_front();
    running_.push_back(std::move(seq));
    queue_changed = true;
  }
  if (options_.send_hints && queue_changed && (hinted_nonempty_ || !waiting_.empty())) {
    std::vector<HintedRequest> hints;
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    for (const Request& r : waiting_) {
      HintedRequest h;
      h.request_id = r.id;
      h.expected_start_ns = now;
      h.keys = runtime_.block_keys(std::span(r.prompt.data(), r.prompt.size() - 1));
      hints.push_back(std::move(h));
    }
    KVTIER_RETURN_IF_ERROR(runtime_.hint(hints).with_context("reference engine: hint"));
    hinted_nonempty_ = !waiting_.empty();
  }
  return ok_status();
}

uint64_t ReferenceEngine::pages_per_layer(const std::vector<Planned>& batch) const {
  const uint32_t pt = runtime_.geometry().page_tokens;
  uint64_t pages = 0;
  for (const Planned& p : batch) pages += ceil_div(p.seq->written + p.tokens, pt);
  return pages;
}

std::vector<ReferenceEngine::Planned> ReferenceEngine::plan_batch() {
  const uint32_t pt = runtime_.geometry().page_tokens;
  std::vector<Planned> batch;
  uint32_t budget = options_.max_step_tokens;
  for (const auto& seq : running_) {
    if (seq->written >= seq->request.prompt.size() && budget > 0) {
      batch.push_back({seq.get(), 1, true});
      budget -= 1;
    }
  }
  for (const auto& seq : running_) {
    const uint64_t prompt = seq->request.prompt.size();
    if (seq->written >= prompt) continue;
    const uint64_t remaining = prompt - seq->written;
    uint64_t n = std::min<uint64_t>({remaining, options_.prefill_chunk, budget});
    if (n < remaining) n = n / pt * pt;  // chunks stay page-aligned up to the prompt's tail
    if (n == 0) continue;
    batch.push_back({seq.get(), static_cast<uint32_t>(n), false});
    budget -= static_cast<uint32_t>(n);
  }
  while (!batch.empty() && pages_per_layer(batch) > hbm_.frames) {
    batch.pop_back();
    ++stats_.shrunk_batches;
  }
  return batch;
}

Status ReferenceEngine::step() {
  KVTIER_RETURN_IF_ERROR(admit_arrivals());
  std::vector<Planned> batch = plan_batch();
  if (batch.empty()) {
    if (!running_.empty()) {
      return resource_exhausted("reference engine: no running sequence fits in HBM (" +
                                std::to_string(hbm_.frames) + " frames per layer)");
    }
    ++step_no_;
    return ok_status();
  }
  Status s = run_step(batch);
  ++step_no_;
  return s;
}

Status ReferenceEngine::run_step(std::vector<Planned>& batch) {
  const uint32_t pt = runtime_.geometry().page_tokens;
  StepInfo info;
  while (true) {
    std::vector<StepItem> items;
    for (const Planned& p : batch) items.push_back({p.seq->sequence, p.tokens});
    auto begun = runtime_.begin_step(items);
    if (begun.ok()) {
      info = std::move(begun).value();
      break;
    }
    if (begun.status().code() == StatusCode::kResourceExhausted && batch.size() > 1) {
      batch.pop_back();
      ++stats_.shrunk_batches;
      continue;
    }
    return std::move(begun).status().with_context("reference engine: begin_step");
  }
  ++stats_.steps;
  if (info.windowed) ++stats_.windowed_steps;

  // What the runtime says each item writes: normally what was asked; with prefetch.on_late =
  // recompute, the first step of a sequence may also hand back part of its reused prefix, and any
  // step the blocks from one whose read from NVMe failed (lost: recomputed, prompt or not).
  std::vector<StepSlice> slices(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const StepItemInfo& it = info.items[i];
    Running& seq = *batch[i].seq;
    if (it.recomputed_tokens > 0) {
      seq.written = it.context_tokens;
      seq.keys.resize(it.context_tokens / pt);
      if (options_.kv_shadow) options_.kv_shadow->truncate(seq.sequence, it.context_tokens);
      // Reused tokens handed back are no longer reused; a lost block's may have been computed.
      const uint64_t unreused =
          std::min<uint64_t>(it.recomputed_tokens, seq.out.reused_tokens > it.context_tokens
                                                       ? seq.out.reused_tokens - it.context_tokens
                                                       : 0);
      seq.out.reused_tokens -= unreused;
      stats_.reused_tokens -= unreused;
      stats_.recomputed_tokens += it.recomputed_tokens;
    }
    if (it.sequence != seq.sequence || it.context_tokens != seq.written ||
        it.context_tokens + it.recomputed_tokens + it.new_tokens > seq.tokens.size()) {
      runtime_.abort_step(info.id).ignore();
      return internal_error("reference engine: step " + std::to_string(info.id) + " item " +
                            std::to_string(i) + " (sequence " + std::to_string(it.sequence) +
                            ") starts at token " + std::to_string(it.context_tokens) +
                            "; the engine expected " + std::to_string(seq.written));
    }
    slices[i].context = it.context_tokens;
    slices[i].tokens = it.recomputed_tokens + it.new_tokens;
    slices[i].decode = batch[i].decode;
  }

  std::vector<float> logits;
  std::vector<std::size_t> sampled;
  Status f = forward(info, batch, slices, logits, sampled);
  if (!f.ok()) {
    runtime_.abort_step(info.id).ignore();
    return f;
  }

  // Keys of the blocks this step filled, in order from the block its first token went into, so
  // end_step publishes them (prompt blocks included: the runtime checks they match).
  std::vector<StepCompletion> completions;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Running& seq = *batch[i].seq;
    const uint64_t full = (slices[i].context + slices[i].tokens) / pt;
    StepCompletion c;
    c.sequence = seq.sequence;
    for (uint64_t b = slices[i].context / pt; b < full; ++b) {
      if (b >= seq.keys.size()) {
        const BlockKey parent = b == 0 ? runtime_.namespace_root() : seq.keys.back();
        auto key = runtime_.block_key(parent, std::span(seq.tokens.data() + b * pt, pt));
        if (!key.ok()) {
          runtime_.abort_step(info.id).ignore();
          return std::move(key).status().with_context("reference engine: block key");
        }
        seq.keys.push_back(*key);
      }
      c.full_block_keys.push_back(seq.keys[b]);
    }
    if (!c.full_block_keys.empty()) completions.push_back(std::move(c));
  }
  Status ended = runtime_.end_step(info.id, completions);
  if (options_.kv_shadow) {
    for (const StepCompletion& c : completions) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].seq->sequence == c.sequence) {
          options_.kv_shadow->publish(c.sequence, slices[i].context / pt, c.full_block_keys);
        }
      }
    }
  }

  // The runtime advanced the sequences whatever end_step reports (an error there is a block that
  // stayed private), so the engine follows.
  const uint32_t vocab = weights_->shape.vocab;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Running& seq = *batch[i].seq;
    seq.written = slices[i].context + slices[i].tokens;
    if (batch[i].decode) {
      stats_.decode_tokens += slices[i].tokens;
    } else {
      stats_.prefilled_tokens += slices[i].tokens;
      seq.out.prefilled_tokens += slices[i].tokens;
    }
  }
  for (std::size_t s = 0; s < sampled.size(); ++s) {
    Running& seq = *batch[sampled[s]].seq;
    const float* row = logits.data() + s * vocab;
    const uint32_t next = argmax(row, vocab);
    seq.tokens.push_back(next);
    seq.out.tokens.push_back(next);
    seq.out.final_logits.assign(row, row + vocab);
    ++stats_.generated_tokens;
  }
  for (std::size_t s = 0; s < sampled.size(); ++s) {
    Running& seq = *batch[sampled[s]].seq;
    if (seq.out.tokens.size() >= seq.request.max_new_tokens) {
      Status closed = finish_sequence(seq);
      if (!closed.ok()) {
        ended.ignore();
        return closed;
      }
    }
  }
  return ended.with_context("reference engine: end_step " + std::to_string(info.id));
}

Status ReferenceEngine::forward(const StepInfo& info, const std::vector<Planned>& batch,
                                std::vector<StepSlice>& slices, std::vector<float>& logits_out,
                                std::vector<std::size_t>& sampled_items) {
  const ModelShape& m = weights_->shape;
  const Weights& w = *weights_;
  const uint64_t rows64 = attention_.rows(slices);
  const auto rows = static_cast<uint32_t>(rows64);
  const std::size_t d = m.d_model;

  std::vector<uint64_t> positions(rows);
  std::vector<float> x(rows * d);
  {
    std::size_t r = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      for (uint32_t t = 0; t < slices[i].tokens; ++t, ++r) {
        positions[r] = slices[i].context + t;
        const uint32_t token = batch[i].seq->tokens[positions[r]];
        std::copy_n(w.embedding.begin() + token * d, d, x.begin() + r * d);
      }
    }
  }
  std::vector<float> h(rows * d), proj(rows * d);
  std::vector<float> q(rows * m.q_dim()), attn(rows * m.q_dim());
  std::vector<float> k(rows * m.kv_dim()), v(rows * m.kv_dim());
  std::vector<float> gate(rows * m.ffn_dim), up(rows * m.ffn_dim);
  std::vector<SequenceId> sequences;
  for (const Planned& p : batch) sequences.push_back(p.seq->sequence);
  KvShadow* shadow = options_.kv_shadow.get();
  if (shadow != nullptr) {
    // Rows past a sequence's context belong to a step that was aborted: written again now.
    for (std::size_t i = 0; i < batch.size(); ++i)
      shadow->truncate(sequences[i], slices[i].context);
  }

  return arena_->execute([&]() -> Status {
    for (uint32_t l = 0; l < m.layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      rms_norm(x.data(), rows, m.d_model, lw.attn_norm.data(), m.rms_eps, h.data());
      matmul(h.data(), rows, m.d_model, lw.wq.data(), m.q_dim(), q.data());
      matmul(h.data(), rows, m.d_model, lw.wk.data(), m.kv_dim(), k.data());
      matmul(h.data(), rows, m.d_model, lw.wv.data(), m.kv_dim(), v.data());
      apply_rope(q.data(), rows, m.qo_heads, m.head_dim, positions.data(), m.rope_theta);
      apply_rope(k.data(), rows, m.kv_heads, m.head_dim, positions.data(), m.rope_theta);

      const std::string where =
          "reference engine: step " + std::to_string(info.id) + " layer " + std::to_string(l);
      Status waited = runtime_.wait_layer(info.id, l);
      if (!waited.ok()) return waited.with_context(where);
      auto table = runtime_.layer_table(info.id, l);
      if (!table.ok()) return std::move(table).status().with_context(where);
      Status s = ok_status();
      if (shadow != nullptr) s = shadow->verify(hbm_, *table, sequences, slices, l, false);
      if (s.ok()) s = attention_.write_kv(*table, slices, k.data(), v.data());
      if (s.ok() && shadow != nullptr) shadow->record(hbm_, *table, sequences, slices, l);
      if (s.ok()) s = attention_.attend(*table, slices, q.data(), attn.data());
      if (s.ok() && shadow != nullptr) s = shadow->verify(hbm_, *table, sequences, slices, l, true);
      if (s.ok()) s = runtime_.end_layer(info.id, l);
      if (!s.ok()) return s.with_context(where);

      matmul(attn.data(), rows, m.q_dim(), lw.wo.data(), m.d_model, proj.data());
      add_into(x.data(), proj.data(), x.size());
      rms_norm(x.data(), rows, m.d_model, lw.mlp_norm.data(), m.rms_eps, h.data());
      matmul(h.data(), rows, m.d_model, lw.w_gate.data(), m.ffn_dim, gate.data());
      matmul(h.data(), rows, m.d_model, lw.w_up.data(), m.ffn_dim, up.data());
      swiglu(gate.data(), up.data(), gate.size(), gate.data());
      matmul(gate.data(), rows, m.ffn_dim, lw.w_down.data(), m.d_model, proj.data());
      add_into(x.data(), proj.data(), x.size());
    }

    // Logits only for rows that end at a sequence's newest token (a prompt's last, or a decode).
    std::vector<float> last;
    std::size_t r = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      r += slices[i].tokens;
      if (slices[i].context + slices[i].tokens == batch[i].seq->tokens.size()) {
        sampled_items.push_back(i);
        last.insert(last.end(), x.begin() + (r - 1) * d, x.begin() + r * d);
      }
    }
    const auto n = static_cast<uint32_t>(sampled_items.size());
    rms_norm(last.data(), n, m.d_model, w.final_norm.data(), m.rms_eps, last.data());
    logits_out.resize(static_cast<std::size_t>(n) * m.vocab);
    matmul(last.data(), n, m.d_model, w.lm_head.data(), m.vocab, logits_out.data());
    return ok_status();
  });
}

Status ReferenceEngine::finish_sequence(Running& seq) {
  Status closed = runtime_.close_sequence(seq.sequence, seq.out.tokens.size());
  seq.out.finished_step = step_no_;
  outputs_.push_back(std::move(seq.out));
  ++stats_.finished_requests;
  const SequenceId id = seq.sequence;
  if (options_.kv_shadow) options_.kv_shadow->close(id);
  std::erase_if(running_, [&](const std::unique_ptr<Running>& r) { return r->sequence == id; });
  return closed.with_context("reference engine: closing sequence " + std::to_string(id));
}

Result<std::vector<RequestOutput>> ReferenceEngine::run_to_completion() {
  while (!done()) KVTIER_RETURN_IF_ERROR(step());
  std::vector<RequestOutput> ordered;
  ordered.reserve(outputs_.size());
  for (uint64_t id : submitted_ids_) {
    for (const RequestOutput& o : outputs_) {
      if (o.id == id) ordered.push_back(o);
    }
  }
  return ordered;
}

}  // namespace kvtier::engine
