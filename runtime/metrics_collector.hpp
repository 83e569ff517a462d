// MetricsCollector: turns kvtier's counters into Prometheus metric families when Prometheus
// scrapes.
//
// Counters stay plain relaxed atomics in the structs their writers own (SchedulerStats,
// TransferStats, the frame allocators); this class reads them only inside Collect(), on the HTTP
// server's thread, and builds the families there. So the data path never registers, allocates,
// locks or even knows Prometheus; the whole cost of metrics on the hot path is the relaxed atomic
// increments it already makes. Rejected: prometheus::Counter/Gauge children updated from the data
// path (each Increment is a CAS loop on a double in the library's own object, and the families
// must be registered in a Registry behind a mutex) and a periodic copier thread (a second clock,
// and values up to one period stale).
//
// Families (names per DESIGN.md "Metrics": base units, `_total` on counters; labels tier, src, dst,
// result only): lookups and per-tier hits in blocks and tokens (hit rate = rate(hits) /
// rate(lookups), deliberately no ratio gauge), promotions/demotions/evictions per tier, prefetch,
// stall, deadline, recompute and failed-load counters, per-link bytes, operations by result and a
// latency histogram on the configured buckets (see metrics_latency.hpp for the mapping), NVMe and
// copy-engine counters, used and capacity bytes per tier, kvtier_build_info{version,cuda} = 1, and
// kvtier_start_time_seconds (when the collector, made as the runtime opens, began: every counter
// counts from there, so a restart shows as a new start time as well as counters back at 0).
// The README's "Monitoring" section lists them all.
//
// Threading: Collect() is const and may run concurrently with itself and with every writer. Values
// are read field by field (each exact on its own at a quiescent point, not a snapshot across
// fields). The sources must outlive the collector's last Collect() (see metrics_sources.hpp).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

#include "runtime/metrics_latency.hpp"
#include "runtime/metrics_sources.hpp"

namespace kvtier {

class MetricsCollector final : public prometheus::Collectable {
 public:
  MetricsCollector(MetricsSources sources, LatencyBucketMap latency);

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The text exposition format of Collect(), as the HTTP endpoint serves it (minus the exposer's
  // own families): for tests, `kvtier-bench` dumps and logs.
  std::string scrape_text() const;

 private:
  void collect_scheduler(const SchedulerStats& s, std::vector<prometheus::MetricFamily>& out) const;
  void collect_transfer(const TransferStats& t, std::vector<prometheus::MetricFamily>& out) const;
  void collect_occupancy(std::vector<prometheus::MetricFamily>& out) const;

  MetricsSources sources_;
  LatencyBucketMap latency_;
  std::string version_;
  std::string cuda_;
  double start_time_seconds_;  // Unix time
};

}  // namespace kvtier
