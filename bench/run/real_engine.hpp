// The real-clock run (`kvtier-bench run --clock real`): the same engine loop as the virtual one
// (the Batcher), but every step moves real bytes through a kvtier::Runtime — an emulated HBM arena,
// the pinned host pool and the io_uring NVMe store in a temporary directory — and computes real
// attention over the layer tables with the CPU kernels (kernels/cpu/attention.hpp), at a geometry
// this machine holds (8 layers, 2 KV heads of 64, bf16, 64-token pages of 32 KiB; 32 query heads).
// The default workload asks questions about six documents of which the HBM tier holds about four,
// so prefixes come back from host memory; `--workload long_context` streams a context four times
// the HBM tier every step instead (link-bound: see the README).
//
// Time is wall time, except that when nothing runs the clock jumps to the next arrival (idle time
// is skipped, not slept). Every step is one engine iteration; per layer the engine waits for the
// layer (that wait is stall), writes the step's new K/V into its frames, runs chunked-prefill /
// decode attention for the batch, and ends the layer. Attention runs on all cores but one, so the
// copy engine (the emulated PCIe link, a memcpy thread paced to tiers.hbm.link_gbps) has a core of
// its own, as a GPU's copy engines are separate from its SMs.
//
// Overlap is measured, not modeled, with three kinds of pass over the same workload:
//   calibration   kvtier, link unthrottled: bytes loaded into HBM per second of compute is the
//                 workload's demand on the link;
//   full          each baseline with the link throttled to link_factor x demand: stall time and
//                 stall / step time;
//   transfer-only each baseline again with no attention (K/V still written): the time the steps
//                 spend waiting for loads when nothing hides them.
// Hidden fraction = 1 - stall(full) / stall(transfer-only); the link's achieved rate is the bytes
// loaded / stall(transfer-only), since the emulated link can deliver less than its throttle when
// per-page costs dominate. The aim (README): with the link at 2x the demand, stall < 5 % of step
// time. Passes run one after another (they would disturb each
// other's timing otherwise). hbm_lru needs a runtime without a host tier, which the Runtime does
// not open (tiers.host.capacity must be > 0): asking for it here is an error that says so.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench/run/baseline.hpp"
#include "bench/run/report.hpp"
#include "bench/run/workload.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier::bench::run {

struct RealRunOptions {
  double link_factor = 2.0;   // link bandwidth / measured demand
  uint64_t max_requests = 0;  // 0: 24 (all of long_context's)
  uint64_t seed = 1;
  std::string workload = "long_context";  // "mix" means the real default (long_context)
  WorkloadParams params;                  // over the real defaults of long_context
  std::string trace;
  double time_scale = 1.0;
  bool show_progress = true;
  uint64_t hbm_bytes = 0;   // 0: the workload's hbm_fraction of its KV, else 8 MiB
  uint64_t host_bytes = 0;  // 0: 512 MiB
  uint64_t nvme_bytes = 0;  // 0: 1 GiB
  uint32_t qo_heads = 32;   // GQA 16: attention does enough work per byte for a memcpy link
  uint32_t max_batched_tokens = 512;
  std::string work_dir;  // "" = $TMPDIR or /tmp
  // The kvtier baseline's measured pass serves its Runtime's metrics on this address ("": off)
  // and keeps serving them for metrics_hold_s after the pass, so a scraper sees the final values.
  std::string metrics_listen;
  double metrics_hold_s = 0;
};

Result<RunReport> run_real(const Config& base, const std::string& config_source,
                           const std::vector<BaselineSpec>& baselines,
                           const RealRunOptions& options, std::ostream& err);

}  // namespace kvtier::bench::run
