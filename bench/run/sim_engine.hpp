// The virtual-clock engine: a continuous-batching LLM server modeled in virtual time, driving
// kvtier's real scheduler (SimWorld) with the step contract, its compute times from PerfModel.
//
// The engine, per scheduler step:
//   - arrivals join the waiting queue at their timestamps; the queue's first requests are hinted
//     (keys and expected start) when the baseline hints, so prefetch and lookahead see them;
//   - admission, in arrival order, while the running requests' full KV (prompt + output, pages of
//     every layer) fits in kv_admit_fraction of HBM and fewer than max_sequences run; a request
//     whose KV exceeds all of HBM runs alone (the scheduler's layer window streams it through HBM)
//     when a host tier exists, and is rejected when none does. Admission opens the sequence with
//     the prompt's keys: what the scheduler reuses shortens the prefill (and starts loading);
//   - iterations: each running request decodes one token, then prompts are chunked into what is
//     left of max_batched_tokens, oldest first; the iteration's time comes from the roofline. One
//     scheduler step covers 1..max_step_iterations iterations — it never spans an arrival, ends
//     when a request finishes while others wait, and is a single iteration whenever the batch does
//     not fit in HBM at once (windowed steps stream every layer once per iteration);
//   - the step: begin_step with each request's new tokens; per layer, wait in virtual time until
//     the layer's readiness fires (time spent there is stall), then compute for step time / layers
//     (transfers progress meanwhile), end_layer; end_step with the content keys of blocks that
//     became full (so answers are reusable by later turns); finished requests close their
//     sequence.
// A token's time is its iteration's end, with a step's stalls counted before its first iteration
// (stalls come from the loads of that first iteration). A layer whose loads failed or never finish
// is a scheduler fault: the run stops with a Status naming the step and layer.
// Single-threaded; one call per thread, sharing only the read-only workload and the progress
// counter. With options.metrics.listen set, a MetricsExporter's HTTP threads read the world's
// counters (atomics) and allocator occupancy (lock-free) while it runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "bench/run/baseline.hpp"
#include "bench/run/perf_model.hpp"
#include "bench/run/results.hpp"
#include "bench/run/workload.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier::bench::run {

struct VirtualRunOptions {
  // Tier capacities in bytes (0 host/nvme: that tier is absent whatever the baseline says).
  uint64_t hbm_kv_bytes = 0;
  uint64_t host_bytes = 0;
  uint64_t nvme_bytes = 0;
  TierKvDtype host_kv_dtype = TierKvDtype::kModel;  // tiers.host.kv_dtype: what PCIe links move
  TierKvDtype nvme_kv_dtype = TierKvDtype::kModel;  // tiers.nvme.kv_dtype: what NVMe links move
  std::array<Watermarks, kNumTiers> watermarks{};
  uint32_t hint_window = 32;                  // waiting requests shown to the scheduler
  std::atomic<uint64_t>* progress = nullptr;  // advanced once per finished or rejected request
  const std::atomic<bool>* cancel = nullptr;  // set: stop at the next step with kCancelled
  // Serve this baseline's counters (scheduler, links in virtual time, occupancy) as Prometheus
  // metrics while it runs, as a Runtime does (empty metrics.listen: off), and keep serving the
  // final values for metrics_hold_s after the run so a scraper sees them.
  MetricsConfig metrics = metrics_off();
  double metrics_hold_s = 0;
  // Check kvtier's own invariants after every `audit_every`th event of the simulated loop (0:
  // never): Scheduler::audit, the page table's audit and each tier's policy membership
  // (SimWorld::audit_every). The run fails with the first broken one, naming the event. Each
  // check walks the whole table: for tests of the scheduler at scale, not for figures.
  uint64_t audit_every = 0;

  static MetricsConfig metrics_off() {
    MetricsConfig m;
    m.listen.clear();
    return m;
  }
};

Result<BaselineResult> run_virtual(const Workload& workload, const BaselineSpec& baseline,
                                   const PerfModel& model, const VirtualRunOptions& options);

}  // namespace kvtier::bench::run
