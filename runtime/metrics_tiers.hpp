// Occupancy probes over an open tier stack: what kvtier_tier_used_bytes and
// kvtier_tier_capacity_bytes read at scrape time.
//
// HBM and host: frames in use x frame stride (FrameArena::used_bytes, a lock-free sum of per-thread
// slots). NVMe: extents in use x extent size (header included: the bytes the store occupies on
// disk). A tier the stack does not have (NVMe disabled) gets no probe, so its series are absent.
// The probes capture raw pointers: the stack must outlive the exporter that calls them.
#pragma once

#include <array>

#include "runtime/metrics_sources.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {

std::array<OccupancyProbe, kNumTiers> tier_occupancy_probes(const TierStack& tiers);

// Every source a runtime has: the scheduler's counters (null: none), the stack's transfer
// counters and its occupancy probes.
MetricsSources runtime_metrics_sources(const SchedulerStats* scheduler, const TierStack& tiers);

}  // namespace kvtier
