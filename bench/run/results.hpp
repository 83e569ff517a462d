// What one baseline's run produced: per-request timings and the counters of the cache, and the
// summary every output format prints (latency percentiles, throughput, hit rate per tier, bytes
// per link, stalls, prefetch timeliness, compute-or-load decisions).
//
// Latencies follow the usual serving-benchmark definitions: TTFT = first token - arrival (queueing
// included); TPOT = (last token - first token) / (output tokens - 1), for requests with more than
// one output token; percentiles by nearest rank. Hit rates are in prompt tokens: tokens reused
// from each tier / prompt tokens of the requests served. Plain data; no threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/transfer_stats.hpp"
#include "kvtier/types.hpp"
#include "scheduler/clock.hpp"

namespace kvtier::bench::run {

struct RequestRecord {
  uint32_t kind = 0;
  Nanos arrival = 0;
  Nanos first_token = -1;
  Nanos finish = -1;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  std::array<uint64_t, kNumTiers> reused_tokens{};  // by the tier each block was found in
  bool rejected = false;  // could never fit (KV larger than every tier that could hold it)
};

struct LatencySummary {
  uint64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

LatencySummary summarize(std::vector<double> values);

struct BaselineResult {
  std::string name;
  std::string summary;
  std::string clock;                             // "virtual" | "real"
  std::array<uint64_t, kNumTiers> tier_bytes{};  // capacity given to each tier (0: absent)

  std::vector<RequestRecord> records;  // in workload order

  // Counters of the run.
  std::array<uint64_t, kNumLinks> link_bytes{};
  std::array<double, kNumLinks> link_busy_s{};
  std::array<uint64_t, kNumTiers> promotions{}, demotions{}, evictions{};  // pages (NVMe: blocks)
  Nanos stall_ns = 0;
  Nanos compute_ns = 0;
  Nanos prefill_gpu_ns = 0;
  uint64_t prefill_tokens = 0;  // prompt tokens computed (including recomputed ones)
  uint64_t prefetches = 0;
  uint64_t late_prefetches = 0;
  // Blocks hints brought into each tier ahead of their request, and of those the ones a request
  // reused (SchedulerStats::hinted_loads).
  std::array<uint64_t, kNumTiers> hinted_loads{}, hinted_loads_reused{};
  uint64_t recompute_tokens = 0;  // cached, but recomputed because loading was slower
  uint64_t steps = 0;
  uint64_t windowed_steps = 0;
  double wall_s = 0;  // CPU wall time the run took
  // --clock real only.
  bool has_overlap = false;
  double transfer_only_s = 0;  // the same steps with no compute: time spent waiting for loads
  double hidden_fraction = 0;  // share of that transfer time hidden behind compute
  double demand_gbps = 0;      // bytes loaded per second of compute
  double link_gbps = 0;        // the link's configured bandwidth
  double achieved_gbps = 0;    // bytes loaded / transfer-only time: what the copy path delivered

  // ---- Derived ----
  uint64_t requests() const { return records.size(); }
  uint64_t completed() const;
  uint64_t rejected() const;
  double duration_s() const;  // first arrival -> last finish
  LatencySummary ttft_ms() const;
  LatencySummary ttft_ms(uint32_t kind) const;  // of the requests of one part (Request::kind)
  LatencySummary tpot_ms() const;
  LatencySummary e2e_ms() const;
  uint64_t input_tokens() const;   // of the requests served
  uint64_t output_tokens() const;  // of the requests served
  uint64_t hit_tokens(Tier tier) const;
  double hit_rate(Tier tier) const;
  double hit_rate() const;
  double requests_per_s() const;
  double output_tokens_per_s() const;
  double total_tokens_per_s() const;
  double stall_fraction() const;       // stall / (stall + compute) over every step
  double prefetch_timeliness() const;  // prefetches that arrived before a step needed them
  // The share of hinted loads into `tier` that a request reused; NaN (shown as "-", JSON null)
  // when hints loaded nothing there.
  double hinted_reuse(Tier tier) const;
};

}  // namespace kvtier::bench::run
