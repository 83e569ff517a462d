// MetricsSources: what the metrics exporter reads when Prometheus scrapes — the counters other
// parts already keep, and per-tier occupancy probes.
//
// Nothing here is owned: the structs pointed at belong to the scheduler and the tier stack, and
// must outlive the exporter (the runtime destroys the exporter first; its destructor stops the HTTP
// server, so no scrape runs after it). A null pointer or an empty probe leaves those series out of
// the scrape (a runtime without NVMe has no nvme occupancy series) rather than exporting zeros that
// would read as "present and empty".
//
// Probes run on the HTTP server's thread at scrape time, concurrently with the data path, so they
// must be thread-safe and cheap (FrameAllocator::used() sums per-thread slots without a lock).
// Rejected: pushing occupancy into gauges from the data path (a store per alloc/free on the hot
// path for a value read every few seconds).
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "kvtier/scheduler_stats.hpp"
#include "kvtier/transfer_stats.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

struct TierOccupancy {
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
};

using OccupancyProbe = std::function<TierOccupancy()>;

struct MetricsSources {
  const SchedulerStats* scheduler = nullptr;        // lookups, hits, moves, stalls
  const TransferStats* transfer = nullptr;          // links, NVMe errors, copy batching
  std::array<OccupancyProbe, kNumTiers> occupancy;  // indexed by tier_index()
};

}  // namespace kvtier
