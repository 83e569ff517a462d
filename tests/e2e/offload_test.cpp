// End to end: the reference engine serves several sequences (about 2,000 generated tokens, shared
// prompt prefixes) over a runtime whose HBM tier is far too small for them, so pages go down to the
// host pool and NVMe and come back every few steps; the tokens and final logits must equal, bit for
// bit, those of a run whose HBM holds everything. Then a runtime restarted on the same NVMe store
// serves the prompts' cached blocks from NVMe instead of the engine recomputing them — counted by
// the runtime and by the engine — with the same outputs again.
//
// KVTIER_E2E_SCALE (a compile definition) multiplies the generated tokens for the slow variant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tests/e2e/e2e_util.hpp"
#include "tiers/frame_arena.hpp"

#ifndef KVTIER_E2E_SCALE
#define KVTIER_E2E_SCALE 1
#endif
// Test names must differ between the two binaries (ctest lists both).
#if KVTIER_E2E_SCALE == 1
#define KVTIER_E2E_SUITE Offload
#else
#define KVTIER_E2E_SUITE OffloadLong
#endif

namespace kvtier::e2e {
namespace {

constexpr uint32_t kScale = KVTIER_E2E_SCALE;

// HBM for about an eighth of the KV the workload holds at its peak (and, at scale 6, for the 134
// frames of one layer of the longest sequence, which a step pins at once), host for about a fifth:
// whatever runs must keep coming back from NVMe.
TierSizes small_tiers() {
  TierSizes s;
  s.hbm_frames = 40 + 56 * kScale;
  s.host_frames = 128 * kScale;
  s.nvme_bytes = 64ull << 20;
  return s;
}

TierSizes roomy_tiers() {
  TierSizes s;
  s.hbm_frames = 4096 * kScale;
  s.host_frames = 256;
  s.nvme_bytes = 64ull << 20;
  return s;
}

class KVTIER_E2E_SUITE : public ::testing::Test {
 protected:
  // The reference outputs: HBM large enough for everything, computed once for the suite.
  static void SetUpTestSuite() {
    ScratchDir dir("e2e-roomy");
    auto rt = open_runtime(engine_config(dir.path(), roomy_tiers()));
    if (rt == nullptr) return;
    shadow_ = std::make_shared<KvShadow>(rt->geometry());
    RunResult r = run_engine(*rt, workload(kScale), checked());
    EXPECT_EQ(r.engine.windowed_steps, 0u) << "the roomy run must not need to offload";
    EXPECT_EQ(r.runtime.demotions[tier_index(Tier::kHost)], 0u);
    reference_ = new std::vector<RequestOutput>(std::move(r.outputs));
    EXPECT_TRUE(rt->shutdown().ok());
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
    shadow_.reset();
  }
  void SetUp() override {
    if (reference_ == nullptr) GTEST_SKIP() << "the NVMe store cannot be opened here";
    ASSERT_EQ(reference_->size(), workload(kScale).size());
    ASSERT_GE(generated(*reference_), 2000u * kScale - 10);
  }

  // Every K/V row the engine reads, in every run but the fp8 ones, is checked against what the
  // reference run wrote and published (bench/engine/kv_shadow.hpp): a page that came back wrong
  // fails the run at that read, naming it.
  static EngineOptions checked() {
    EngineOptions o;
    o.kv_shadow = shadow_;
    return o;
  }

  static std::vector<RequestOutput>* reference_;
  static std::shared_ptr<KvShadow> shadow_;
};

std::vector<RequestOutput>* KVTIER_E2E_SUITE::reference_ = nullptr;
std::shared_ptr<KvShadow> KVTIER_E2E_SUITE::shadow_;

TEST_F(KVTIER_E2E_SUITE, TinyHbmGivesTheSameTokensAndLogitsBitForBit) {
  ScratchDir dir("e2e-small");
  auto rt = open_runtime(engine_config(dir.path(), small_tiers()));
  ASSERT_NE(rt, nullptr);
  const uint64_t verified_before = shadow_->verified_rows();
  const RunResult r = run_engine(*rt, workload(kScale), checked());
  expect_identical(*reference_, r.outputs, "HBM of 96 frames vs. HBM for everything");
  EXPECT_GT(shadow_->verified_rows(), verified_before);

  // The run really did travel: layer-by-layer steps, pages down to host and NVMe and back up.
  const RuntimeStats& s = r.runtime;
  std::printf(
      "steps %llu (windowed %llu, items deferred for HBM %llu), generated %llu, prefilled %llu, "
      "reused %llu; pages down to host %llu, blocks to nvme %llu, pages up to host %llu, to hbm "
      "%llu; stalls %.3f s\n",
      (unsigned long long)r.engine.steps, (unsigned long long)r.engine.windowed_steps,
      (unsigned long long)r.engine.shrunk_batches, (unsigned long long)r.engine.generated_tokens,
      (unsigned long long)r.engine.prefilled_tokens, (unsigned long long)r.engine.reused_tokens,
      (unsigned long long)s.demotions[tier_index(Tier::kHost)],
      (unsigned long long)s.demotions[tier_index(Tier::kNvme)],
      (unsigned long long)s.promotions[tier_index(Tier::kHost)],
      (unsigned long long)s.promotions[tier_index(Tier::kHbm)], s.stall_nanos / 1e9);
  EXPECT_GT(r.engine.windowed_steps, 0u);
  EXPECT_GT(r.engine.shrunk_batches, 0u) << "the batch never had to wait for HBM";
  EXPECT_GT(s.demotions[tier_index(Tier::kHost)], 0u) << "nothing went down to the host pool";
  EXPECT_GT(s.demotions[tier_index(Tier::kNvme)], 0u) << "nothing went down to NVMe";
  EXPECT_GT(s.promotions[tier_index(Tier::kHost)], 0u) << "nothing came back up from NVMe";
  EXPECT_GT(s.promotions[tier_index(Tier::kHbm)], 0u) << "nothing came back up into HBM";
  EXPECT_EQ(s.failed_loads, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_EQ(s.io_errors, 0u);

  // Prefix reuse: the request that arrives after the 96-token prefix was computed loads it, as
  // does the one that waited for a slot for its 64-token prefix.
  ASSERT_EQ(r.outputs.size(), 6u);
  EXPECT_GE(r.outputs[4].reused_tokens, 96u);
  EXPECT_GE(r.outputs[5].reused_tokens, 64u);
  EXPECT_EQ(r.engine.prefilled_tokens + r.engine.reused_tokens, r.engine.prompt_tokens);
  EXPECT_EQ(s.open_sequences, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
}

// tiers.nvme.kv_dtype: fp8_e4m3: the same workload with every block that goes to NVMe quantized.
// The reference engine's small random model is chaotic (a perturbation of one logit in 1e-3
// changes the greedy token and the rest of the sequence with it), so outputs are not compared
// token by token; the fp8 round trip's accuracy is checked in tiers/converting_store_test and
// tiers/fp8_host_tier_test. Here: every request is served to its full length, blocks really went
// down in fp8 and came back, and nothing failed.
RunResult serve_with_fp8_tiers(const Config& config, const std::vector<Request>& requests,
                               const std::vector<RequestOutput>& reference, const char* what) {
  auto rt = open_runtime(config);
  EXPECT_NE(rt, nullptr);
  if (rt == nullptr) return {};
  RunResult r = run_engine(*rt, requests);
  const RuntimeStats& s = r.runtime;
  EXPECT_GT(s.demotions[tier_index(Tier::kNvme)], 0u) << "nothing went down to NVMe";
  EXPECT_GT(s.promotions[tier_index(Tier::kHost)], 0u) << "nothing came back up from NVMe";
  EXPECT_GT(s.promotions[tier_index(Tier::kHbm)], 0u) << "nothing came back up from the host";
  EXPECT_EQ(s.failed_loads, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_EQ(s.io_errors, 0u);
  const PageFormat fp8 = PageFormat::fp8(config.model.geometry);
  EXPECT_EQ(s.capacity_bytes[tier_index(Tier::kNvme)] % fp8.block_bytes(), 0u);
  EXPECT_EQ(r.outputs.size(), reference.size());
  std::size_t same_prefix = 0;
  for (std::size_t i = 0; i < std::min(r.outputs.size(), reference.size()); ++i) {
    const RequestOutput& e = reference[i];
    const RequestOutput& a = r.outputs[i];
    EXPECT_EQ(e.tokens.size(), a.tokens.size()) << "request " << e.id;
    std::size_t k = 0;
    while (k < e.tokens.size() && k < a.tokens.size() && e.tokens[k] == a.tokens[k]) ++k;
    same_prefix += k;
  }
  std::printf("%s: %zu of %llu generated tokens before each request's first difference\n", what,
              same_prefix, static_cast<unsigned long long>(generated(r.outputs)));
  EXPECT_EQ(s.open_sequences, 0u);
  EXPECT_TRUE(rt->shutdown().ok());
  return r;
}

TEST_F(KVTIER_E2E_SUITE, Fp8OnNvmeServesEveryRequestFromQuantizedBlocks) {
  ScratchDir dir("e2e-fp8");
  Config config = engine_config(dir.path(), small_tiers());
  config.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  serve_with_fp8_tiers(config, workload(kScale), *reference_, "fp8 on NVMe");
}

TEST_F(KVTIER_E2E_SUITE, Fp8OnHostAndNvmeServesEveryRequestFromQuantizedPages) {
  ScratchDir dir("e2e-fp8-host");
  Config config = engine_config(dir.path(), small_tiers());
  config.tiers.host.kv_dtype = TierKvDtype::kFp8E4M3;
  config.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  const RunResult r =
      serve_with_fp8_tiers(config, workload(kScale), *reference_, "fp8 on host and NVMe");
  // The same host capacity holds more pages: frames of fp8 pages are smaller.
  const uint64_t host_frame = FrameArena::frame_stride(PageFormat::fp8(config.model.geometry));
  EXPECT_EQ(r.runtime.capacity_bytes[tier_index(Tier::kHost)],
            config.tiers.host.capacity_bytes / host_frame * host_frame);
}

// What fp8 offload costs the model, measured where the model is not chaotic: the logits of a
// request's first token, computed over a prompt prefix reused from fp8 pages, against the same
// request served with every prefix in HBM. Many short requests share three prefixes and arrive
// spaced out, so the prefixes keep leaving HBM (for the fp8 host tier and NVMe) between uses.
// The bound is loose on purpose (a relative L2 error of the logits under 0.1 and the same top
// token for most requests; the figures are printed): a wrong scale or a page decoded into the
// wrong frame gives errors of order 1.
TEST_F(KVTIER_E2E_SUITE, Fp8ReusedPrefixesMoveTheFirstTokenLogitsLittle) {
  std::vector<Request> requests;
  const std::vector<std::vector<uint32_t>> prefixes = {tokens(96, 71), tokens(128, 72),
                                                       tokens(80, 73)};
  for (uint32_t i = 0; i < 24 * kScale; ++i) {
    requests.push_back({100 + i, concat(prefixes[i % 3], tokens(9 + i % 7, 500 + i)), 1, 4 * i});
  }
  ScratchDir roomy_dir("e2e-fp8-logits-roomy");
  auto roomy = open_runtime(engine_config(roomy_dir.path(), roomy_tiers()));
  ASSERT_NE(roomy, nullptr);
  const RunResult exact = run_engine(*roomy, requests);
  ASSERT_TRUE(roomy->shutdown().ok());

  ScratchDir dir("e2e-fp8-logits");
  TierSizes tight = small_tiers();
  tight.hbm_frames = 48;
  Config config = engine_config(dir.path(), tight);
  config.tiers.host.kv_dtype = TierKvDtype::kFp8E4M3;
  config.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  auto rt = open_runtime(config);
  ASSERT_NE(rt, nullptr);
  const RunResult fp8 = run_engine(*rt, requests);
  ASSERT_TRUE(rt->shutdown().ok());

  ASSERT_EQ(exact.outputs.size(), requests.size());
  ASSERT_EQ(fp8.outputs.size(), requests.size());
  uint32_t compared = 0;
  uint32_t same_top = 0;
  double worst_rel = 0.0;
  double sum_rel = 0.0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const RequestOutput& e = exact.outputs[i];
    const RequestOutput& a = fp8.outputs[i];
    const uint32_t from_below =
        a.reused_by_tier[tier_index(Tier::kHost)] + a.reused_by_tier[tier_index(Tier::kNvme)];
    if (from_below == 0) continue;  // its prefix was still in HBM, or computed
    ASSERT_EQ(e.final_logits.size(), a.final_logits.size());
    double diff = 0.0;
    double norm = 0.0;
    for (std::size_t v = 0; v < e.final_logits.size(); ++v) {
      const double d = static_cast<double>(a.final_logits[v]) - e.final_logits[v];
      diff += d * d;
      norm += static_cast<double>(e.final_logits[v]) * e.final_logits[v];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    worst_rel = std::max(worst_rel, rel);
    sum_rel += rel;
    ++compared;
    same_top += e.tokens == a.tokens ? 1 : 0;
  }
  std::printf(
      "fp8 host and NVMe, first-token logits over reused prefixes: %u requests, relative L2 error "
      "mean %.2e worst %.2e, same top token %u of %u\n",
      compared, compared ? sum_rel / compared : 0.0, worst_rel, same_top, compared);
  ASSERT_GE(compared, requests.size() / 2) << "too few prefixes came back from below HBM";
  EXPECT_GT(worst_rel, 0.0) << "the reused pages were not quantized";
  EXPECT_LT(worst_rel, 0.1);
  EXPECT_GE(same_top * 10, compared * 8);
}

// Nothing cached was recomputed: each prompt was prefilled only past its last full cached block.
void expect_every_cached_block_reused(const std::vector<Request>& requests, const RunResult& r) {
  ASSERT_EQ(r.outputs.size(), requests.size());
  uint64_t expected_prefill = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const uint64_t len = requests[i].prompt.size();
    const uint64_t cached = (len - 1) / kPageTokens * kPageTokens;
    EXPECT_EQ(r.outputs[i].reused_tokens, cached) << "request " << requests[i].id;
    EXPECT_EQ(r.outputs[i].prefilled_tokens, len - cached) << "request " << requests[i].id;
    expected_prefill += len - cached;
  }
  EXPECT_EQ(r.engine.prefilled_tokens, expected_prefill);
}

TEST_F(KVTIER_E2E_SUITE, AfterARestartPromptsComeFromNvmeNotRecomputed) {
  ScratchDir dir("e2e-restart");
  const Config config = engine_config(dir.path(), small_tiers());
  const std::vector<Request> requests = workload(kScale);
  uint64_t first_prefilled = 0;
  {
    auto rt = open_runtime(config);
    ASSERT_NE(rt, nullptr);
    const RunResult r = run_engine(*rt, requests, checked());
    expect_identical(*reference_, r.outputs, "first run on the store");
    first_prefilled = r.engine.prefilled_tokens;
    ASSERT_TRUE(rt->shutdown().ok());  // persists every cached block to NVMe
  }

  auto rt = open_runtime(config);
  ASSERT_NE(rt, nullptr);
  const RuntimeStats opened = rt->stats();
  EXPECT_GT(opened.nvme_recovered_blocks, 0u);
  // Every full block of every prompt (but the one holding its last token) is on NVMe, and only
  // there: the shared 96-token prefix first of all.
  const std::vector<uint32_t> shared(requests[0].prompt.begin(), requests[0].prompt.begin() + 96);
  auto m = rt->match(rt->block_keys(shared));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->blocks, 6u);
  EXPECT_EQ(m->by_tier[tier_index(Tier::kNvme)], 6u);

  const RunResult r = run_engine(*rt, requests, checked());
  expect_identical(*reference_, r.outputs, "after a restart on the same store");
  ASSERT_EQ(r.outputs.size(), requests.size());

  expect_every_cached_block_reused(requests, r);
  EXPECT_LT(r.engine.prefilled_tokens, first_prefilled);
  EXPECT_EQ(r.engine.recomputed_tokens, 0u);
  EXPECT_EQ(r.runtime.recompute_tokens, 0u);
  // The first request opened straight after the restart found its whole prefix on NVMe.
  EXPECT_EQ(r.outputs[0].reused_by_tier[tier_index(Tier::kNvme)] * uint64_t{kPageTokens},
            r.outputs[0].reused_tokens);
  EXPECT_GE(r.runtime.hit_tokens[tier_index(Tier::kNvme)], 96u);
  EXPECT_EQ(r.runtime.failed_loads, 0u);
  EXPECT_EQ(r.runtime.checksum_failures, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
}

// The same restart with the host tier and NVMe in fp8: shutdown persists the cached blocks as
// fp8 pages, the reopened store (same format) recovers them, and every prompt is served from
// them without recomputing what is cached (outputs are not compared: fp8 is lossy; the first-token
// logits test measures what that costs).
TEST_F(KVTIER_E2E_SUITE, AfterARestartFp8BlocksAreRecoveredAndReused) {
  ScratchDir dir("e2e-restart-fp8");
  Config config = engine_config(dir.path(), small_tiers());
  config.tiers.host.kv_dtype = TierKvDtype::kFp8E4M3;
  config.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  const std::vector<Request> requests = workload(kScale);
  {
    auto rt = open_runtime(config);
    ASSERT_NE(rt, nullptr);
    run_engine(*rt, requests);
    ASSERT_TRUE(rt->shutdown().ok());
  }
  auto rt = open_runtime(config);
  ASSERT_NE(rt, nullptr);
  EXPECT_GT(rt->stats().nvme_recovered_blocks, 0u);
  const RunResult r = run_engine(*rt, requests);
  expect_every_cached_block_reused(requests, r);
  EXPECT_EQ(r.outputs[0].reused_by_tier[tier_index(Tier::kNvme)] * uint64_t{kPageTokens},
            r.outputs[0].reused_tokens);
  EXPECT_EQ(r.runtime.failed_loads, 0u);
  EXPECT_EQ(r.runtime.checksum_failures, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
}

}  // namespace
}  // namespace kvtier::e2e
