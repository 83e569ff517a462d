// Helpers for the end-to-end tests: runtimes over emulated HBM, a host pool and an NVMe store in a
// temporary directory, sized in frames of the reference engine's model; the request workload;
// running an engine to completion; comparing outputs bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/engine/engine.hpp"
#include "tests/runtime/runtime_test_util.hpp"

namespace kvtier::e2e {

using engine::EngineOptions;
using engine::KvShadow;
using engine::ReferenceEngine;
using engine::Request;
using engine::RequestOutput;
using engine::Weights;
using kvtier::testing::ScratchDir;

inline constexpr uint32_t kPageTokens = 16;

inline std::shared_ptr<const Weights> model() {
  static const std::shared_ptr<const Weights> weights = [] {
    auto w = Weights::generate(engine::ModelShape{});
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return w.ok() ? *w : nullptr;
  }();
  return weights;
}

struct TierSizes {
  uint32_t hbm_frames = 4096;
  uint32_t host_frames = 1024;
  uint64_t nvme_bytes = 32ull << 20;  // 0: no NVMe tier
};

inline Config engine_config(const std::filesystem::path& dir, const TierSizes& sizes) {
  Config c;
  c.model.name = "kvtier-reference-engine";
  c.model.geometry = engine::ModelShape{}.geometry(Dtype::kBF16, kPageTokens);
  const uint64_t page = c.model.geometry.page_bytes();
  c.tiers.hbm.backend = HbmBackend::kEmulated;
  c.tiers.hbm.capacity_bytes = sizes.hbm_frames * page;
  c.tiers.host.capacity_bytes = sizes.host_frames * page;
  c.tiers.host.huge_pages = false;
  c.tiers.host.lock_memory = false;
  c.tiers.nvme.enabled = sizes.nvme_bytes > 0;
  c.tiers.nvme.capacity_bytes = sizes.nvme_bytes > 0 ? sizes.nvme_bytes : 1ull << 20;
  c.tiers.nvme.paths = {(dir / "store0.kvs").string()};
  c.tiers.nvme.queue_depth = 32;
  c.metrics.listen = "";
  // These tests check that cached prefixes are found and served, bit for bit, not the
  // compute-or-load policy (the scheduler's tests do): so plan with a drive's bandwidth and a slow
  // prefill, and loading always wins. Left to measurement, the runtime times each transfer from
  // submit to completion, time queued behind other copies and I/O included; on two busy cores that
  // estimate falls so low that cached prompts get recomputed now and then.
  c.tiers.nvme.read_gbps = 2;
  c.tiers.nvme.write_gbps = 1;
  c.policies.prefill_tokens_per_s = 100;
  // Paces the emulated HBM link (GB/s), to run these tests against a slower PCIe.
  if (const char* gbps = std::getenv("KVTIER_E2E_HBM_LINK_GBPS")) {
    c.tiers.hbm.link_gbps = std::atof(gbps);
  }
  return c;
}

// Opens a runtime; nullptr when the NVMe store cannot be opened here (O_DIRECT or io_uring
// refused), for the caller to skip. Any other failure is a test failure.
inline std::unique_ptr<Runtime> open_runtime(const Config& c) {
  auto rt = Runtime::open(c);
  if (!rt.ok() && rt.status().code() == StatusCode::kUnavailable) return nullptr;
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

// Deterministic token ids below the model's vocabulary.
inline std::vector<uint32_t> tokens(std::size_t n, uint64_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<uint32_t>(x % engine::ModelShape{}.vocab);
  }
  return t;
}

inline std::vector<uint32_t> concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Six requests, about 2,000 generated tokens times `scale`: four share a 96-token prefix (two of
// them arrive together and both compute it; one arrives once it is cached), two share a 64-token
// prefix (the second waits for a free slot, so its prefix has left HBM by then), one stands alone.
inline std::vector<Request> workload(uint32_t scale = 1) {
  const auto a = tokens(96, 1001);
  const auto b = tokens(64, 2002);
  std::vector<Request> r;
  r.push_back({1, concat(a, tokens(40, 1)), 330 * scale, 0});
  r.push_back({2, concat(a, tokens(57, 2)), 330 * scale, 0});
  r.push_back({3, tokens(120, 3), 340 * scale, 0});
  r.push_back({4, concat(b, tokens(50, 4)), 335 * scale, 10});
  r.push_back({5, concat(a, tokens(23, 5)), 330 * scale, 40});
  r.push_back({6, concat(b, tokens(77, 6)), 335 * scale, 200});
  return r;
}

struct RunResult {
  std::vector<RequestOutput> outputs;
  engine::EngineStats engine;
  RuntimeStats runtime;
};

inline RunResult run_engine(Runtime& rt, const std::vector<Request>& requests,
                            const EngineOptions& options = {}) {
  RunResult result;
  EngineOptions o = options;
  // One engine thread keeps oneTBB's workers out of a ThreadSanitizer run of these tests (the
  // system oneTBB is not instrumented, so its task passing reads as races).
  if (const char* threads = std::getenv("KVTIER_E2E_ENGINE_THREADS"); threads && o.threads == 0) {
    o.threads = static_cast<uint32_t>(std::atoi(threads));
  }
  auto eng = ReferenceEngine::create(rt, model(), o);
  EXPECT_TRUE(eng.ok()) << eng.status().to_string();
  if (!eng.ok()) return result;
  for (const Request& r : requests) {
    Status s = (*eng)->submit(r);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  auto outputs = (*eng)->run_to_completion();
  EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
  if (outputs.ok()) result.outputs = std::move(outputs).value();
  result.engine = (*eng)->stats();
  result.runtime = rt.stats();
  return result;
}

// Same generated tokens and the same final logits, bit for bit (memcmp, so -0.0 != 0.0 and NaNs
// compare by payload).
inline void expect_identical(const std::vector<RequestOutput>& expected,
                             const std::vector<RequestOutput>& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const RequestOutput& e = expected[i];
    const RequestOutput& a = actual[i];
    ASSERT_EQ(e.id, a.id) << what;
    const auto diverged =
        std::mismatch(e.tokens.begin(), e.tokens.end(), a.tokens.begin(), a.tokens.end());
    EXPECT_EQ(e.tokens, a.tokens) << what << ": request " << e.id
                                  << " generated other tokens, from token "
                                  << (diverged.first - e.tokens.begin()) << " of "
                                  << e.tokens.size() << " (admitted at step " << a.admitted_step
                                  << ", finished at " << a.finished_step << "; " << a.reused_tokens
                                  << " prompt tokens reused)";
    ASSERT_EQ(e.final_logits.size(), a.final_logits.size()) << what << ": request " << e.id;
    EXPECT_EQ(0, std::memcmp(e.final_logits.data(), a.final_logits.data(),
                             e.final_logits.size() * sizeof(float)))
        << what << ": request " << e.id << " ends with other logits";
  }
}

inline uint64_t generated(const std::vector<RequestOutput>& outputs) {
  uint64_t n = 0;
  for (const RequestOutput& o : outputs) n += o.tokens.size();
  return n;
}

}  // namespace kvtier::e2e
