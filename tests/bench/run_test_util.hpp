// Shared fixtures of the bench/run tests: the H200 / Llama-3.1-8B model and tiny tier sizes that
// make a few dozen requests exercise every tier in milliseconds.
#pragma once

#include <gtest/gtest.h>

#include "bench/run/baseline.hpp"
#include "bench/run/perf_model.hpp"
#include "bench/run/presets.hpp"
#include "bench/run/sim_engine.hpp"
#include "bench/run/workload.hpp"

namespace kvtier::bench::run::testing {

inline PerfModel h200_8b() {
  auto gpu = load_gpu_preset("h200");
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto model = load_model_preset("llama-3.1-8b");
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  auto perf = PerfModel::create(*gpu, *model);
  EXPECT_TRUE(perf.ok()) << perf.status().to_string();
  return *perf;
}

// Bytes of `blocks` simulated blocks (all layers) of the model.
inline uint64_t blocks_bytes(const PerfModel& m, uint64_t blocks) {
  return blocks * m.sim_geometry().block_bytes();
}

// Tiers small enough that a tiny chat workload overflows HBM and host.
inline VirtualRunOptions tiny_tiers(const PerfModel& m) {
  VirtualRunOptions o;
  o.hbm_kv_bytes = blocks_bytes(m, 48);
  o.host_bytes = blocks_bytes(m, 96);
  o.nvme_bytes = blocks_bytes(m, 4096);
  o.watermarks = {Watermarks{0.85, 0.95}, Watermarks{0.85, 0.95}, Watermarks{0.85, 0.95}};
  return o;
}

inline Workload tiny_chat(const PerfModel& m, uint64_t seed = 7) {
  WorkloadParams p{{"users", "24"},
                   {"rate", "2"},
                   {"turns", "4"},
                   {"system_tokens", "1500"},
                   {"message_tokens", "300"},
                   {"answer_tokens", "40"},
                   {"think_s", "3"}};
  auto w = generate_workload("chat", p, seed, m.sim_geometry().page_tokens);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return *w;
}

inline BaselineSpec baseline(const PerfModel& m, std::string_view name) {
  auto specs = make_baselines(name, PoliciesConfig{}, m.prefill_tokens_per_s());
  EXPECT_TRUE(specs.ok()) << specs.status().to_string();
  return specs->front();
}

inline BaselineResult run_or_fail(const Workload& w, const BaselineSpec& b, const PerfModel& m,
                                  const VirtualRunOptions& o) {
  auto r = run_virtual(w, b, m, o);
  EXPECT_TRUE(r.ok()) << b.name << ": " << r.status().to_string();
  return r.ok() ? *r : BaselineResult{};
}

}  // namespace kvtier::bench::run::testing
