#include "bench/replay/replay.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "bench/replay/reference.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/policies/admission.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/hint_board.hpp"
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
    const auto& cap = spec_.capacity_blocks;
    if (cap[ti(Tier::kHbm)] > FrameAllocator::kMaxFrames ||
        cap[ti(Tier::kHost)] > FrameAllocator::kMaxFrames ||
        cap[ti(Tier::kNvme)] > FrameAllocator::kMaxFrames) {
      return invalid_argument("a tier of " + std::to_string(spec_.capacity_tokens) +
                              " tokens needs more than 2^32 frames; use larger blocks");
    }
    KVTIER_ASSIGN_OR_RETURN(hbm_,
                            FrameAllocator::create(static_cast<uint32_t>(cap[ti(Tier::kHbm)])));
    TierAllocators allocators;
    allocators.hbm = hbm_.get();
    if (cap[ti(Tier::kHost)] > 0) {
      KVTIER_ASSIGN_OR_RETURN(host_,
                              FrameAllocator::create(static_cast<uint32_t>(cap[ti(Tier::kHost)])));
      allocators.host = host_.get();
    }
    if (cap[ti(Tier::kNvme)] > 0) {
      KVTIER_ASSIGN_OR_RETURN(
          nvme_, ExtentAllocator::create({static_cast<uint32_t>(cap[ti(Tier::kNvme)])}, 4096, 0));
      allocators.nvme = nvme_.get();
    }
    PageTableOptions pt;
    pt.layers = 1;
    pt.shards = 16;
    uint64_t total = 0;
    for (uint64_t c : cap) total += c;
    pt.expected_blocks = std::min<uint64_t>(total + 1024, w_.unique_blocks);
    KVTIER_ASSIGN_OR_RETURN(table_, PageTable::create(pt, allocators));

    for (Tier t : kAllTiers) {
      if (cap[ti(t)] == 0 && t != Tier::kHbm) continue;
      EvictorOptions eo;
      eo.capacity_blocks = cap[ti(t)];
      eo.expected_blocks = std::min<uint64_t>(cap[ti(t)] + 16, w_.unique_blocks);
      eo.hints = options_.lookahead > 0 ? &hints_ : nullptr;
      evictors_owned_[ti(t)] = make_evictor(spec_.eviction, eo);
      evictors_[ti(t)] = evictors_owned_[ti(t)].get();
    }
    write_ = make_write_strategy(options_.write, options_.write_selective_hits);
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
    const uint64_t hit = w_.hit_tokens(r, m.blocks);
    result.hit_tokens += hit;
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
        keep = placement_->admit_new(Tier::kHbm, facts);
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

}  // namespace

Result<RunResult> run_replay(const ReplayWorkload& workload, const RunSpec& spec,
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
    switch (spec.kind) {
      case RunKind::kReferenceLru:
        result.hit_tokens = reference_lru_hit_tokens(workload, blocks);
        break;
      case RunKind::kBelady: result.hit_tokens = belady_hit_tokens(workload, blocks); break;
      case RunKind::kCountOracle:
        result.hit_tokens = count_oracle_hit_tokens(workload, blocks, options.lookahead);
        break;
      case RunKind::kPolicy: break;
    }
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

}  // namespace kvtier::replay
