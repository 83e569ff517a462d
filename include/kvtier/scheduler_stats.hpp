// Counters of the scheduler: what the engine asked for, where it was found, what moved and what it
// cost.
//
// Plain relaxed atomics written on the scheduler's loop (and by match() on engine threads) and
// read at scrape time by runtime/ (Prometheus) or by tests and benchmarks, so a reader never
// waits on the loop. Gauges mirror state the loop owns and are stored after each change to it. Hit
// rates are derived from counters (hits / lookups), never stored as a ratio, so rate() over any
// window is exact. Each field is exact on its own at a quiescent point; reads are not a snapshot
// across fields.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "kvtier/transfer_stats.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

struct SchedulerStats {
  using Counter = std::atomic<uint64_t>;
  using Gauge = std::atomic<uint64_t>;

  // match(): blocks and tokens asked for, and found per tier (the slowest tier each must be loaded
  // from). lookups count every key of every chain presented; hits count the cached prefix.
  Counter lookup_blocks{0};
  Counter lookup_tokens{0};
  std::array<Counter, kNumTiers> hit_blocks{};
  std::array<Counter, kNumTiers> hit_tokens{};

  // Pages moved up (toward HBM) and down, per destination tier.
  std::array<Counter, kNumTiers> promotions{};
  std::array<Counter, kNumTiers> demotions{};
  // Copies given up to make room (pages for HBM/host, blocks for NVMe), per tier.
  std::array<Counter, kNumTiers> evictions{};
  // Of those, copies a faster tier held in full (a promotion's left-overs, which write_back gives
  // up first, writing nothing): a block that leaves the faster tier later is written down again.
  std::array<Counter, kNumTiers> shadowed_evictions{};

  // Loads into HBM issued ahead of a step (from hints, at open_sequence, for the next layers),
  // counted as they resolve: arrived first (or failed, or never needed), or still in flight when
  // a step needed them (also late_prefetches). A load a step joins at the instant it was issued
  // had no lead and counts as neither (Scheduler::demand_prefetched).
  Counter late_prefetches{0};
  Counter prefetches{0};
  // Speculative loads, per tier (HBM, host; NVMe stays 0): blocks whose copies a waiting
  // request's hint brought in before any sequence asked for them (HBM pages, or the block read
  // from NVMe into host memory), counted once per block as they arrive; and of those, the blocks
  // a request then reused while the hint's copies were still there. Loads minus reuses, once the
  // hinted requests have started, is what the hints moved for nothing: evicted before their
  // request came, or for a request that never reused them.
  std::array<Counter, kNumTiers> hinted_loads{};
  std::array<Counter, kNumTiers> hinted_loads_reused{};
  // Time engine threads spent waiting on a layer that was not ready, in nanoseconds.
  Counter stall_nanos{0};
  Counter stalls{0};
  // Waits that ran out their deadline.
  Counter deadline_misses{0};
  // Compute-or-load: blocks the planner chose to recompute rather than load (too slow to load).
  Counter recompute_blocks{0};
  Counter recompute_tokens{0};
  // Loads that failed (I/O error, checksum) and became misses.
  Counter failed_loads{0};
  // Copies a slower tier could not store (an fp8 tier and a page with NaN or inf, or a failed
  // NVMe write): their blocks are dropped instead of sent down again (a failing disk's refusals
  // are lifted when its writes succeed after a pause).
  Counter refused_demotions{0};
  // Times failed NVMe writes paused writing there (failures in a row; see NvmeHealth), and
  // whether it is paused now (1) or not (0).
  Counter nvme_write_pauses{0};
  Gauge nvme_writes_paused{0};
  // The same for reads: while paused, prompts reuse no block from NVMe and hints read none.
  Counter nvme_read_pauses{0};
  Gauge nvme_reads_paused{0};
  // NVMe extents retired after media errors (bad sectors, or a dead drive's whole file): they
  // hold no block until a restart.
  Gauge nvme_retired_extents{0};
  // Blocks the NVMe tier lost with a drive taken out of service (NvmeFileHealth).
  Counter nvme_blocks_lost{0};
  // Host frames held by failed NVMe reads until the drive lets them go: those a hung drive holds
  // (abandoned at tiers.nvme.io_timeout_ms) stay out of use until it answers.
  Gauge host_frames_held{0};

  Counter steps{0};
  Counter windowed_steps{0};  // steps that did not fit in HBM at once and ran layer by layer
  Counter sequences_opened{0};
  Counter blocks_published{0};
  Counter blocks_deduplicated{0};  // publish found the block already cached: shared, not copied
  // Cached blocks whose copies were gone (or too slow to load), written again by a step that
  // recomputed them into their existing entries: complete again, but not newly published.
  Counter blocks_refilled{0};

  // Sequences open now, and distinct blocks held by prefix pins now.
  Gauge open_sequences{0};
  Gauge pinned_prefix_blocks{0};

  // Where copies wait: bytes queued on each link (indexed by Link), not yet submitted, per
  // priority (kQueuePriorityNames: a step waits; a sequence just opened; ahead of need; a lower
  // copy), and bytes in flight on it.
  static constexpr int kQueuePriorities = 4;
  std::array<std::array<Gauge, kQueuePriorities>, kNumLinks> link_queued_bytes{};
  std::array<Gauge, kNumLinks> link_inflight_bytes{};
};

inline constexpr std::array<const char*, SchedulerStats::kQueuePriorities> kQueuePriorityNames{
    "demand", "admitted", "prefetch", "write_back"};

}  // namespace kvtier
