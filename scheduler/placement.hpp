// Placement: the tier-cascade decision shared by the scheduler and the trace replay. When a tier
// needs N free frames (a fill, a promotion, or usage above its high watermark), it decides which
// blocks' copies leave that tier and where they go, and returns that as a plan. It never moves
// bytes or changes the page table: an executor carries the plan out — instantly and metadata-only
// in the replay and the tests (execute_plan_metadata below), asynchronously with real transfers
// in the scheduler.
//
// Rules, per victim the tier's Evictor proposes (best first):
//   - last: a block that an open sequence holds and no faster tier holds in full (the sequence's
//     next step reads it from this tier) goes only once every other block is leaving or skipped,
//     whatever the policy: a tier's victims are walked twice, first without such blocks (a copy
//     below that a faster one shadows goes as any other). Without this rule, LRU in the
//     scheduler evicted the blocks of sequences that had not stepped for a while (a long prompt
//     between its chunks, one waiting for its prefix from NVMe) and loaded them back for their
//     next step: the Mooncake trace at its recorded rate (kvtier-bench run, virtual clock, H200)
//     moved 28.3 TB host->HBM (13.7 TB with it) and served 1.78 requests/s (2.26), with stall
//     38 % of step time (11 %);
//   - skipped: a page pinned in that tier, a copy of the block in flight there (filling or
//     draining), a block already in the plan, an NVMe copy of a block in use that is the last of
//     some page; the evictor itself skips what its policy protects (prefix_aware and lookahead: a
//     block before its children);
//   - plain drop: a faster tier holds every page and the write strategy keeps no copies below
//     on purpose (shadowed: under write_back, a copy a promotion left below), a ready copy
//     already exists in a slower tier (clean below), or the strategy does not write down
//     evicted blocks;
//   - a shadowed drop relies on the copy above: in one plan, a block shadowed-dropped from one
//     tier is dropped from no other, and one dropped from a tier is not shadowed-dropped;
//   - demote to the next configured slower tier when that tier admits it: for NVMe, NvmeAdmission
//     (hits); then, only when the destination is the last tier and it is full, that tier's
//     evictor's admit(). Host above NVMe takes every demotion: its own victim moves on down, and
//     only the last tier decides what leaves the cache (a middle tier that refused would drop a
//     block the tier below would have kept); a block can go to NVMe only when every page has a
//     ready copy in memory (the extent holds all layers);
//     the destination's room is planned first, recursively (host -> NVMe -> drop), and those
//     moves come earlier in the plan;
//   - otherwise drop: a cache may lose a block; the next request recomputes it;
//   - a block kept in memory is never lost and never goes to NVMe: a private block
//     (BlockKey::is_private: K/V an engine wrote that has no content key yet; NVMe is addressed
//     by content key) and, with no NVMe tier to write to (none, writes paused, or NVMe refused
//     that block: set_nvme_refuses), a block an open sequence holds. In host memory only
//     its pages whose HBM copy is ready can leave, in HBM with no room below only those host
//     memory holds, and only those count as freed. The same in host memory for a block in use
//     with no NVMe copy that the plan does not write there. When host memory has room for some of
//     its HBM pages but not all, those go down (PlannedMove::pages_down): memory full of such
//     pages still trades a page down for one a step needs, where a whole block would not fit.
// A block is never duplicated within a tier: copies are per key, and a shared block (refcount > 1)
// is one copy that every sequence reads.
//
// Accounting. The caller passes the frames it considers free per tier (free in the allocator,
// minus fills it has reserved, plus drains it has started); the plan records what it frees and
// takes per tier, so several plans can be made before any is executed. Frames are pages for HBM
// and host, extents (one per block) for NVMe.
//
// Cost: a plan walks each tier's eviction order about once, however many times the cascade asks
// that tier for room (victims are fetched in doubling batches and consumed in order), and once
// more if it reaches the blocks open sequences read; planning is linear in the victims it
// considers.
//
// Threading: called from the scheduler's loop (or the replay's thread), like the evictors it
// uses; it reads the page table through its locked lookups, one entry at a time, and holds no lock
// of its own. The page table can change between planning and execution; an executor re-checks
// every transition (the page table refuses illegal ones) and skips moves that became impossible.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/policies/admission.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/write_strategy.hpp"

namespace kvtier {

// Whether a block's pages can live only in HBM and host memory, and none may be lost: a private
// block's (NVMe is addressed by content key) and, with no NVMe tier, one an open sequence holds.
// The one rule behind placement's plans and begin_step's count of the frames such pages keep.
inline bool kept_in_memory(const BlockKey& key, bool referenced, bool nvme_tier) {
  return key.is_private() || (referenced && !nvme_tier);
}

// One block's copy leaving one tier.
struct PlannedMove {
  BlockFacts block;           // key and parent from the page table, the rest from the evictor
  Tier from = Tier::kHbm;     // the tier that loses the copy
  std::optional<Tier> to;     // the tier that gains it; nullopt: drop
  uint32_t frames_freed = 0;  // frames of `from` (pages; 1 extent for NVMe)
  uint32_t frames_taken = 0;  // frames of `to` (pages without a copy there yet; 1 NVMe extent)
  bool clean_below = false;   // dropped because a ready copy exists in a slower tier
  bool shadowed = false;      // dropped because a faster tier holds every page
  // A block kept in memory that host memory has room for only in part: this many of its HBM
  // pages without a host copy go down, the highest layers first (read last by a step); 0: all.
  uint32_t pages_down = 0;
};

struct PlacementPlan {
  // In execution order: the room a move needs in its destination is made by moves before it.
  std::vector<PlannedMove> moves;
  std::array<uint64_t, kNumTiers> freed{};  // frames each tier gives up when the plan runs
  std::array<uint64_t, kNumTiers> taken{};  // frames each tier fills when the plan runs
  // Frames of the asked tier the plan could not free (everything pinned, in flight or protected).
  uint64_t shortfall = 0;

  bool empty() const { return moves.empty(); }
};

struct PlacementCounters {
  uint64_t plans = 0;
  uint64_t demotions = 0;       // moves to a slower tier
  uint64_t drops = 0;           // moves that dropped a copy with nothing written
  uint64_t clean_drops = 0;     // drops of copies that were safe below
  uint64_t shadowed_drops = 0;  // drops of copies a faster tier holds in full
  uint64_t refused = 0;         // demotions refused by admission (dropped instead)
  uint64_t skipped = 0;         // victims proposed by an evictor but not movable now
};

// Victims a plan leaves alone, one filter per tier (indexed by tier_index): room asked of one
// tier is asked of the tiers below it too (its victims go there), and whether a block can leave
// depends on the tier it leaves.
using TierFilters = std::array<KeyFilter, kNumTiers>;

class Placement {
 public:
  // `evictors[tier_index(t)]` null means tier t is not configured. Nothing is owned; everything
  // must outlive the placement.
  Placement(const PageTable& table, std::array<Evictor*, kNumTiers> evictors,
            const NvmeAdmission& admission, const WriteStrategy& write);

  // Plans room for `frames` more frames in `tier`, given the frames free per tier as the caller
  // accounts them. Victims for which `skip` is true are left alone as well (e.g. the blocks of the
  // request being served), in every tier. Returns an empty plan when enough frames are already
  // free.
  PlacementPlan plan_room(Tier tier, uint64_t frames, std::array<uint64_t, kNumTiers> free_frames,
                          KeyFilter skip = KeyFilter::none()) {
    return plan_room(tier, frames, free_frames, TierFilters{skip, skip, skip});
  }
  // The same, with the victims left alone chosen per tier: skip[tier_index(t)] for tier t.
  PlacementPlan plan_room(Tier tier, uint64_t frames, std::array<uint64_t, kNumTiers> free_frames,
                          const TierFilters& skip);

  // Frames to free in a tier whose usage crossed the high watermark, to bring it to the low one;
  // 0 below the high watermark.
  static uint64_t watermark_deficit(uint64_t capacity, uint64_t used, const Watermarks& marks);

  // Whether a new block is worth keeping when HBM is full, given the frames free per tier as in
  // plan_room. Its frame pushes HBM's victim down the cascade (or, written through, its copies
  // take frames below), and only the last configured tier drops a block out of the cache for
  // it, once every tier is full: so that tier's evictor is asked (admit()), and every block is
  // admitted while a slower tier has a free frame. The replay uses it for bypass (a refused
  // block is not retained). The scheduler does not: a block its step computed stays in HBM until
  // a plan evicts it.
  bool admit_new(const BlockFacts& block, std::array<uint64_t, kNumTiers> free_frames) const;

  // Whether blocks may be written to NVMe now (NvmeHealth). While not, plans send nothing
  // there and keep every block in use in memory, as with no NVMe tier; NVMe still gives up its
  // own copies when room is asked of it.
  void set_nvme_writable(bool writable) { nvme_writable_ = writable; }
  // Blocks NVMe will not take (the scheduler's refusals: a write of the block failed, or fp8
  // cannot encode it): planned as with no NVMe tier, block by block — never demoted there, and
  // kept in memory while in use, some of their pages going down where host memory has room for
  // only some. `refuses` must outlive the placement. Default: none.
  void set_nvme_refuses(KeyFilter refuses) { nvme_refuses_ = refuses; }

  const PlacementCounters& counters() const { return counters_; }

 private:
  struct Budget;
  // Adds moves that free `frames` in `tier`; returns the frames it could not free.
  uint64_t free_in(Tier tier, uint64_t frames, Budget& budget, const TierFilters& skip,
                   PlacementPlan& plan, int depth);
  std::optional<Tier> next_tier(Tier tier) const;

  const PageTable& table_;
  std::array<Evictor*, kNumTiers> evictors_;
  const NvmeAdmission& admission_;
  const WriteStrategy& write_;
  PlacementCounters counters_;
  bool nvme_writable_ = true;
  KeyFilter nvme_refuses_ = KeyFilter::none();
  std::vector<BlockKey> victims_;  // scratch
};

// Carries a plan out at once, metadata only (no bytes move): for each move, the page-table
// transitions of a completed transfer (drain the source, fill the destination) and the evictors'
// on_insert/on_erase. Moves that became illegal since planning are skipped and counted. Used by
// the trace replay and the tests; the scheduler has its own asynchronous executor.
struct ExecutionResult {
  uint64_t executed = 0;
  uint64_t skipped = 0;
};
Result<ExecutionResult> execute_plan_metadata(PageTable& table,
                                              std::array<Evictor*, kNumTiers> evictors,
                                              const PlacementPlan& plan);

// Tells the evictors of the tiers below HBM that track `key` whether it is shadowed there now
// (EntryView::shadowed, Evictor::on_shadowed), as the page table says. Whoever changes a block's
// copies calls it after the change (execute_plan_metadata does; the replay after its fills; the
// scheduler reports from its own membership sync).
void report_shadowed(const PageTable& table, std::array<Evictor*, kNumTiers> evictors,
                     const BlockKey& key);

}  // namespace kvtier
