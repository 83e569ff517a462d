#include "bench/replay/replay.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "bench/replay/reference.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/policies/admission.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/shadowed_first.hpp"
#include "scheduler/policies/write_strategy.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier::replay {

std::string RunSpec::policy_name() const {
  switch (kind) {
    case RunKind::kReferenceLru: return "ref_lru";
    case RunKind::kBelady: return "opt";
    case RunKind::kCountOracle: return "count_oracle";
    case RunKind::kPolicy: break;
  }
  return std::string(eviction_policy_name(eviction));
}

namespace {

constexpr std::size_t ti(Tier t) { return static_cast<std::size_t>(tier_index(t)); }

// One policy run: the tiers, the table, the policies, and the per-request procedure.
class PolicyRun {
 public:
  PolicyRun(const ReplayWorkload& w, const RunSpec& spec, const RunOptions& options)
      : w_(w), spec_(spec), options_(options), admission_(options.nvme_min_hits) {}

  Status init() {
    // A tier that can hold every block of the trace never fills, so it never evicts, never asks
    // its evictor to admit a newcomer, and every request's hit is the one of an unbounded cache;
    // more frames than blocks change nothing but the memory they take (a FrameAllocator has a
    // word per frame, written up front: 15 GB for 6e10 tokens in 16-token blocks). So each tier
    // gets at most that many frames. The HBM evictor is clamped too: it is consulted only when
    // HBM is full (to choose victims, and to admit a newcomer), which a clamped HBM never is. A
    // lower tier's evictor keeps the requested capacity: it is asked to admit every block demoted
    // into it, full or not, and the lookahead policy's answer depends on the capacities through
    // its horizon, so clamping it would change that policy's results. That policy measures its
    // horizon and sizes its ghost in the whole cache (the evictors' capacities summed), so a huge
    // lower tier gives every tier's evictor the largest ghost. The references need no clamp (their
    // memory follows the trace, not the capacity).
    std::array<uint64_t, kNumTiers> frames{};
    for (Tier t : kAllTiers) {
      frames[ti(t)] = std::min<uint64_t>(spec_.capacity_blocks[ti(t)], w_.unique_blocks);
    }
    if (frames[ti(Tier::kHbm)] > FrameAllocator::kMaxFrames ||
        frames[ti(Tier::kHost)] > FrameAllocator::kMaxFrames ||
        frames[ti(Tier::kNvme)] > FrameAllocator::kMaxFrames) {
      return internal_error("a trace of " + std::to_string(w_.unique_blocks) +
                            " blocks needs more than 2^32 frames");  // build_workload refuses it
    }
    KVTIER_ASSIGN_OR_RETURN(hbm_,
                            FrameAllocator::create(static_cast<uint32_t>(frames[ti(Tier::kHbm)])));
    TierAllocators allocators;
    allocators.hbm = hbm_.get();
    if (frames[ti(Tier::kHost)] > 0) {
      KVTIER_ASSIGN_OR_RETURN(
          host_, FrameAllocator::create(static_cast<uint32_t>(frames[ti(Tier::kHost)])));
      allocators.host = host_.get();
    }
    if (frames[ti(Tier::kNvme)] > 0) {
      KVTIER_ASSIGN_OR_RETURN(
          nvme_,
          ExtentAllocator::create({static_cast<uint32_t>(frames[ti(Tier::kNvme)])}, 4096, 0));
      allocators.nvme = nvme_.get();
    }
    PageTableOptions pt;
    pt.layers = 1;
    pt.shards = 16;
    uint64_t total = 0;
    for (uint64_t f : frames) total += f;
    pt.expected_blocks = std::min<uint64_t>(total + 1024, w_.unique_blocks);
    KVTIER_ASSIGN_OR_RETURN(table_, PageTable::create(pt, allocators));
    write_ = make_write_strategy(options_.write, options_.write_selective_hits);
    std::array<uint64_t, kNumTiers> evictor_blocks{};
    uint64_t cache_blocks = 0;  // the whole cache, as its evictors count it (0 per absent tier)
    for (Tier t : kAllTiers) {
      evictor_blocks[ti(t)] = t == Tier::kHbm ? frames[ti(t)] : spec_.capacity_blocks[ti(t)];
      cache_blocks += evictor_blocks[ti(t)];
    }
    std::array<std::optional<EvictorOptions>, kNumTiers> tier_options;
    for (Tier t : kAllTiers) {
      if (frames[ti(t)] == 0 && t != Tier::kHbm) continue;
      EvictorOptions& eo = tier_options[ti(t)].emplace();
      eo.capacity_blocks = evictor_blocks[ti(t)];
      eo.cache_blocks = cache_blocks;
      eo.expected_blocks = std::min<uint64_t>(frames[ti(t)] + 16, w_.unique_blocks);
      eo.hints = options_.lookahead > 0 ? &hints_ : nullptr;
    }
    auto tier_evictors = make_tier_evictors(spec_.eviction, tier_options);
    for (Tier t : kAllTiers) {
      if (!tier_options[ti(t)]) continue;
      evictors_owned_[ti(t)] = shadowed_first(std::move(tier_evictors[ti(t)]), t, *write_);
      evictors_[ti(t)] = evictors_owned_[ti(t)].get();
    }
    placement_ = std::make_unique<Placement>(*table_, evictors_, admission_, *write_);
    return ok_status();
  }

  Result<RunResult> run(std::atomic<uint64_t>* progress) {
    RunResult result;
    result.policy = spec_.policy_name();
    result.capacity_tokens = spec_.capacity_tokens;
    result.total_tokens = w_.total_input_tokens;
    const std::size_t n = w_.requests();
    for (std::size_t i = 1; i <= options_.lookahead && i < n; ++i) {
      KVTIER_RETURN_IF_ERROR(hint(i));
    }
    for (std::size_t i = 0; i < n; ++i) {
      KVTIER_RETURN_IF_ERROR(request(i, result));
      if (options_.lookahead > 0) {
        if (i + 1 < n) KVTIER_RETURN_IF_ERROR(hints_.remove(i + 1));
        if (i + 1 + options_.lookahead < n)
          KVTIER_RETURN_IF_ERROR(hint(i + 1 + options_.lookahead));
      }
      if (progress != nullptr) progress->fetch_add(1, std::memory_order_relaxed);
    }
    KVTIER_RETURN_IF_ERROR(table_->audit().with_context("after replaying " + result.policy));
    for (Evictor* e : evictors_) {
      if (e != nullptr && e->misuse() != 0) {
        return internal_error("the " + result.policy + " evictor saw " +
                              std::to_string(e->misuse()) + " calls that broke its contract");
      }
    }
    result.bypassed_blocks = bypassed_;
    return result;
  }

 private:
  Status hint(std::size_t r) { return hints_.add(r, w_.timestamps_ms[r], w_.request_keys(r)); }

  std::array<uint64_t, kNumTiers> free_frames() const {
    return {hbm_ ? hbm_->free_count() : 0u, host_ ? host_->free_count() : 0u,
            nvme_ ? nvme_->free_count() : 0u};
  }

  // Makes `frames` free in `tier`, executing plans until it is done or no plan helps. Victims for
  // which `skip` is true stay (the block being promoted: its only copy may sit in a slower tier
  // that the cascade makes room in).
  Result<bool> ensure_room(Tier tier, uint64_t frames, KeyFilter skip = KeyFilter::none()) {
    for (int attempt = 0; attempt < 64; ++attempt) {
      const auto free = free_frames();
      if (free[ti(tier)] >= frames) return true;
      PlacementPlan plan = placement_->plan_room(tier, frames, free, skip);
      if (plan.empty()) return false;
      KVTIER_ASSIGN_OR_RETURN(ExecutionResult done,
                              execute_plan_metadata(*table_, evictors_, plan));
      for (const PlannedMove& m : plan.moves) {
        if (!m.to) KVTIER_RETURN_IF_ERROR(collect(m.block.key));
      }
      if (done.executed == 0) return false;
    }
    return free_frames()[ti(tier)] >= frames;
  }

  // Erases a block with no copy left, then its parents that became useless, leaves first.
  Status collect(BlockKey key) {
    while (!key.is_null()) {
      bool erasable = false;
      BlockKey parent;
      Status st = table_->visit(key, [&](const EntryView& v) {
        erasable = v.copies(Tier::kHbm) == 0 && v.copies(Tier::kHost) == 0 &&
                   v.copies(Tier::kNvme) == 0 && v.refcount() == 0 && v.cached_children() == 0 &&
                   v.pinned_pages() == 0;
        parent = v.parent();
      });
      if (st.code() == StatusCode::kNotFound) return ok_status();
      KVTIER_RETURN_IF_ERROR(st);
      if (!erasable) return ok_status();
      KVTIER_RETURN_IF_ERROR(table_->erase(key));
      key = parent;
    }
    return ok_status();
  }

  // Fills a ready copy of the block in `tier` (metadata only) and tells that tier's evictor.
  Status fill(Tier tier, const BlockFacts& facts) {
    KVTIER_RETURN_IF_ERROR(table_->update(facts.key, [&](EntryView& v) -> Status {
      const CopyId copy = tier == Tier::kNvme ? CopyId::nvme() : CopyId::page(tier, 0);
      KVTIER_RETURN_IF_ERROR(v.begin_fill(copy).status());
      return v.complete_fill(copy);
    }));
    Evictor* e = evictors_[ti(tier)];
    if (e != nullptr && !e->contains(facts.key)) e->on_insert(facts);
    report_shadowed(*table_, evictors_, facts.key);
    return ok_status();
  }

  // Copies a new or reused block down as the write strategy says, room permitting.
  Status write_down(const BlockFacts& facts, uint32_t hits, bool completed) {
    WriteContext ctx;
    ctx.hits = hits;
    for (Tier t : {Tier::kHost, Tier::kNvme}) {
      if (evictors_[ti(t)] != nullptr) ctx.available = ctx.available.with(t);
    }
    KVTIER_RETURN_IF_ERROR(table_->visit(facts.key, [&](const EntryView& v) {
      for (Tier t : kAllTiers) {
        if (v.copies(t) != 0) ctx.present = ctx.present.with(t);
      }
    }));
    const TierMask to = completed ? write_->on_complete(ctx) : write_->on_hit(ctx);
    for (Tier t : {Tier::kHost, Tier::kNvme}) {
      if (!to.has(t)) continue;
      if (t == Tier::kNvme && !admission_.admits(hits)) continue;
      KVTIER_ASSIGN_OR_RETURN(bool room, ensure_room(t, 1));
      if (room) KVTIER_RETURN_IF_ERROR(fill(t, facts));
    }
    return ok_status();
  }

  Status request(std::size_t r, RunResult& result) {
    const auto keys = w_.request_keys(r);
    const MatchResult m = table_->match(keys);
    HitTally tally;
    const uint64_t hit = w_.tally_hit(r, m.blocks, tally);
    result.hit_tokens += hit;
    for (std::size_t b = 0; b < kReuseDistanceBuckets; ++b) {
      result.hit_tokens_by_distance[b] += tally.by_distance[b];
    }
    for (Tier t : kAllTiers) {
      result.hit_tokens_by_tier[ti(t)] += uint64_t{m.by_tier[ti(t)]} * w_.block_tokens;
    }
    // The hit is capped at input_length. The capped tokens (up to 511, the unused tail of the last
    // trace block) span several replay blocks when they are small, and those may be served from
    // different tiers: take them off the matched blocks from the last one back, each from its own.
    uint64_t excess = uint64_t{m.blocks} * w_.block_tokens - hit;
    for (std::size_t b = m.blocks; excess > 0 && b > 0; --b) {
      std::optional<Tier> tier;
      KVTIER_RETURN_IF_ERROR(
          table_->visit(keys[b - 1], [&](const EntryView& v) { tier = v.match_tier(); }));
      if (!tier) {
        return internal_error("matched block " + std::to_string(b - 1) + " of request " +
                              std::to_string(r) + " has no copy to be served from");
      }
      const uint64_t cut = std::min<uint64_t>(excess, w_.block_tokens);
      result.hit_tokens_by_tier[ti(*tier)] -= cut;
      excess -= cut;
    }

    bool chain_dropped = false;
    for (std::size_t j = 0; j < keys.size(); ++j) {
      BlockFacts facts;
      facts.key = keys[j];
      facts.parent = j > 0 ? keys[j - 1] : BlockKey{};
      facts.depth = static_cast<uint32_t>(j);
      facts.request_hit_blocks = m.blocks;
      facts.request_blocks = static_cast<uint32_t>(keys.size());

      bool exists = false;
      std::optional<Tier> tier;
      std::array<bool, kNumTiers> has{};
      Status st = table_->visit(facts.key, [&](const EntryView& v) {
        exists = true;
        tier = v.match_tier();
        facts.hits = v.stats().hits;
        for (Tier t : kAllTiers) has[ti(t)] = v.copies(t) != 0;
      });
      if (!st.ok() && st.code() != StatusCode::kNotFound) return st;

      if (tier) {  // cached somewhere: a use, and a miss for each tier without a copy
        for (Tier t : kAllTiers) {
          Evictor* e = evictors_[ti(t)];
          if (e == nullptr) continue;
          if (has[ti(t)]) {
            e->on_access(facts.key);
          } else {
            e->on_miss(facts);
          }
        }
        if (!has[ti(Tier::kHbm)]) {
          const BlockKey promoted = facts.key;
          const auto keep_promoted = [&](const BlockKey& k) { return k == promoted; };
          KVTIER_ASSIGN_OR_RETURN(bool room, ensure_room(Tier::kHbm, 1, KeyFilter(keep_promoted)));
          if (room) KVTIER_RETURN_IF_ERROR(fill(Tier::kHbm, facts));
        }
        if (j < m.blocks) KVTIER_RETURN_IF_ERROR(write_down(facts, facts.hits, false));
        continue;
      }

      for (Evictor* e : evictors_) {
        if (e != nullptr) e->on_miss(facts);
      }
      if (chain_dropped) continue;
      if (!exists) KVTIER_RETURN_IF_ERROR(table_->create_block(facts.key, facts.parent));
      bool keep = true;
      if (hbm_->free_count() == 0) {
        keep = placement_->admit_new(facts, free_frames());
        if (!keep) ++bypassed_;
        if (keep) {
          KVTIER_ASSIGN_OR_RETURN(keep, ensure_room(Tier::kHbm, 1));
        }
      }
      // Making room may have collected this very entry (an uncached parent whose last cached
      // descendant was the victim): create it again.
      if (keep && !table_->contains(facts.key)) {
        KVTIER_RETURN_IF_ERROR(table_->create_block(facts.key, facts.parent));
      }
      if (!keep) {
        chain_dropped = true;
        KVTIER_RETURN_IF_ERROR(collect(facts.key));
        continue;
      }
      KVTIER_RETURN_IF_ERROR(fill(Tier::kHbm, facts));
      KVTIER_RETURN_IF_ERROR(write_down(facts, 0, true));
    }
    // The request ends as it starts: its output is generated (in no time) before the next one.
    for (Evictor* e : evictors_) {
      if (e != nullptr) e->on_request_end(keys, w_.output_tokens[r]);
    }
    return ok_status();
  }

  const ReplayWorkload& w_;
  const RunSpec spec_;
  const RunOptions options_;
  NvmeAdmission admission_;
  std::unique_ptr<FrameAllocator> hbm_;
  std::unique_ptr<FrameAllocator> host_;
  std::unique_ptr<ExtentAllocator> nvme_;
  std::unique_ptr<PageTable> table_;
  HintBoard hints_;
  std::array<std::unique_ptr<Evictor>, kNumTiers> evictors_owned_;
  std::array<Evictor*, kNumTiers> evictors_{};
  std::unique_ptr<WriteStrategy> write_;
  std::unique_ptr<Placement> placement_;
  uint64_t bypassed_ = 0;
};

Result<RunResult> run_one(const ReplayWorkload& workload, const RunSpec& spec,
                          const RunOptions& options, std::atomic<uint64_t>* progress) {
  if (spec.kind != RunKind::kPolicy) {
    RunResult result;
    result.policy = spec.policy_name();
    result.capacity_tokens = spec.capacity_tokens;
    result.total_tokens = workload.total_input_tokens;
    uint64_t blocks = 0;
    int tiers = 0;
    for (uint64_t c : spec.capacity_blocks) {
      blocks += c;
      tiers += c > 0 ? 1 : 0;
    }
    HitTally hits;
    switch (spec.kind) {
      case RunKind::kReferenceLru: hits = reference_lru_hits(workload, blocks); break;
      case RunKind::kBelady: hits = belady_hits(workload, blocks); break;
      case RunKind::kCountOracle:
        hits = count_oracle_hits(workload, blocks, options.lookahead);
        break;
      case RunKind::kPolicy: break;
    }
    result.hit_tokens = hits.tokens;
    result.hit_tokens_by_distance = hits.by_distance;
    result.by_tier = tiers <= 1 && spec.capacity_blocks[ti(Tier::kNvme)] == 0 &&
                     spec.capacity_blocks[ti(Tier::kHost)] == 0;
    if (result.by_tier) result.hit_tokens_by_tier[ti(Tier::kHbm)] = result.hit_tokens;
    if (progress != nullptr) progress->fetch_add(workload.requests(), std::memory_order_relaxed);
    return result;
  }
  PolicyRun run(workload, spec, options);
  KVTIER_RETURN_IF_ERROR(run.init());
  return run.run(progress);
}

}  // namespace

// No exception leaves: the policies and the page table allocate as they go, and a replay thread
// that let bad_alloc escape would end the process (std::terminate) with no word of which run.
Result<RunResult> run_replay(const ReplayWorkload& workload, const RunSpec& spec,
                             const RunOptions& options, std::atomic<uint64_t>* progress) {
  try {
    return run_one(workload, spec, options, progress);
  } catch (const std::bad_alloc& e) {
    return resource_exhausted(std::string("out of memory (") + e.what() + ")");
  } catch (const std::exception& e) {
    return internal_error(std::string("exception: ") + e.what());
  } catch (...) {
    return internal_error("unknown exception");
  }
}

Result<uint64_t> parse_token_count(std::string_view text) {
  const std::string shown = "\"" + std::string(text) + "\"";
  const auto not_decimal = [&] {
    return invalid_argument(shown +
                            " is not a decimal number of tokens (digits, then an optional "
                            "fraction and exponent: e.g. 1e6, 2.5e6 or 3000000)");
  };
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t i = 0;
  std::string digits;    // integer and fraction digits, without the point
  int64_t exponent = 0;  // value = digits * 10^exponent
  while (i < text.size() && is_digit(text[i])) digits.push_back(text[i++]);
  if (digits.empty()) return not_decimal();
  if (i < text.size() && text[i] == '.') {
    ++i;
    const std::size_t from = i;
    while (i < text.size() && is_digit(text[i])) {
      digits.push_back(text[i++]);
      --exponent;
    }
    if (i == from) return not_decimal();
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
    const std::size_t from = i;
    int64_t e = 0;
    for (; i < text.size() && is_digit(text[i]); ++i) {
      e = std::min<int64_t>(e * 10 + (text[i] - '0'), 1'000'000);  // beyond 64 bits either way
    }
    if (i == from) return not_decimal();
    exponent += negative ? -e : e;
  }
  if (i != text.size()) return not_decimal();

  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  if (exponent < 0) {
    // The digits the exponent moves behind the point must all be zeros.
    const std::size_t behind =
        std::min<std::size_t>(static_cast<std::size_t>(-exponent), digits.size());
    if (digits.find_first_not_of('0', digits.size() - behind) != std::string::npos) {
      return invalid_argument(shown + " is not a whole number of tokens");
    }
    digits.resize(digits.size() - behind);
  } else if (!digits.empty()) {
    if (exponent > 20) return invalid_argument(shown + " is more than 2^64 - 1 tokens");
    digits.append(static_cast<std::size_t>(exponent), '0');
  }
  uint64_t v = 0;
  for (const char c : digits) {
    const auto d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return invalid_argument(shown + " is more than 2^64 - 1 tokens");
    }
    v = v * 10 + d;
  }
  return v;
}

}  // namespace kvtier::replay
