// End to end over random set-ups: for each seed, a random workload (shared prefixes, prompt and
// generation lengths, arrivals) served by the reference engine over tiers of random sizes, with a
// random eviction, write and late-load policy, layer window and engine batching. Two runs share a
// KvShadow (bench/engine/kv_shadow.hpp): one whose HBM holds everything, then the random one. Every
// K/V row the random run reads must be what it wrote or what the first run published under the
// block's key — checked at the read, so a page that came back wrong fails naming itself — and
// both runs must give the same tokens and logits, bit for bit. Throughout the random run an
// auditor thread checks the runtime's invariants (Runtime::audit) between the loop's decisions.
//
// Compile definitions: KVTIER_RANDOM_TIERS_SEEDS, how many seeds run (a few in the default set,
// many in the slow variant), from KVTIER_RANDOM_TIERS_FIRST_SEED;
// KVTIER_RANDOM_TIERS_ENGINE_THREADS (1 in the variant that runs under ThreadSanitizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "runtime/config_names.hpp"
#include "tests/e2e/e2e_util.hpp"

#ifndef KVTIER_RANDOM_TIERS_SEEDS
#define KVTIER_RANDOM_TIERS_SEEDS 4
#endif
// Test names must differ between the binaries built from this file (ctest lists them all).
#ifndef KVTIER_RANDOM_TIERS_NAME
#define KVTIER_RANDOM_TIERS_NAME Seeds
#endif
#ifndef KVTIER_RANDOM_TIERS_FIRST_SEED
#define KVTIER_RANDOM_TIERS_FIRST_SEED 1
#endif
// oneTBB workers of the engine; 0: all cores.
#ifndef KVTIER_RANDOM_TIERS_ENGINE_THREADS
#define KVTIER_RANDOM_TIERS_ENGINE_THREADS 0
#endif

namespace kvtier::e2e {
namespace {

struct RandomSetup {
  std::vector<Request> requests;
  TierSizes sizes;
  PoliciesConfig policies;
  uint32_t layer_window = 4;
  EngineOptions engine;
  std::string describe;
};

RandomSetup random_setup(uint32_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 11);
  const auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  RandomSetup s;
  std::vector<std::vector<uint32_t>> prefixes;
  const uint64_t prefix_count = pick(1, 3);
  for (uint64_t p = 0; p < prefix_count; ++p) {
    prefixes.push_back(
        tokens(pick(1, 8) * kPageTokens + pick(0, 1) * pick(1, 15), 1000 * seed + p));
  }
  const uint64_t count = pick(3, 7);
  uint64_t longest = 0;
  for (uint64_t i = 0; i < count; ++i) {
    std::vector<uint32_t> prompt = tokens(pick(1, 70), 7 * seed + 1000 * i + 17);
    if (pick(0, 3) != 0) prompt = concat(prefixes[pick(0, prefix_count - 1)], prompt);
    const auto generate = static_cast<uint32_t>(pick(10, 140));
    longest = std::max<uint64_t>(longest, prompt.size() + generate);
    s.requests.push_back({i + 1, std::move(prompt), generate, pick(0, 120)});
  }
  s.engine.threads = KVTIER_RANDOM_TIERS_ENGINE_THREADS;
  s.engine.max_running = static_cast<uint32_t>(pick(1, 4));
  s.engine.prefill_chunk = static_cast<uint32_t>(pick(1, 4) * kPageTokens);
  // HBM from just over what one layer of the longest request needs (engine.hpp) to a few layers.
  const uint64_t one_layer = (longest + kPageTokens - 1) / kPageTokens;
  s.sizes.hbm_frames = static_cast<uint32_t>(one_layer + pick(8, 24) * pick(1, 6));
  s.sizes.host_frames = static_cast<uint32_t>(pick(96, 384));
  s.sizes.nvme_bytes = 64ull << 20;
  s.policies.eviction = static_cast<EvictionPolicy>(pick(0, 4));
  s.policies.write = static_cast<WritePolicy>(pick(0, 2));
  s.policies.prefetch.on_late = static_cast<LatePolicy>(pick(0, 1));
  s.layer_window = static_cast<uint32_t>(pick(1, 4));
  s.describe =
      "seed " + std::to_string(seed) + ": " + std::to_string(count) + " requests, hbm " +
      std::to_string(s.sizes.hbm_frames) + " frames, host " + std::to_string(s.sizes.host_frames) +
      ", eviction " + std::string(enum_name(s.policies.eviction)) + ", write " +
      std::string(enum_name(s.policies.write)) + ", on_late " +
      std::string(enum_name(s.policies.prefetch.on_late)) + ", window " +
      std::to_string(s.layer_window) + ", max_running " + std::to_string(s.engine.max_running) +
      ", chunk " + std::to_string(s.engine.prefill_chunk);
  return s;
}

class RandomTiers : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RandomTiers, EveryReadIsWhatWasWrittenAndOutputsMatchHbmForEverything) {
  const RandomSetup setup = random_setup(GetParam());
  SCOPED_TRACE(setup.describe);
  std::printf("%s\n", setup.describe.c_str());

  ScratchDir roomy_dir("e2e-random-roomy");
  TierSizes roomy;
  roomy.hbm_frames = 4096;
  roomy.host_frames = 256;
  roomy.nvme_bytes = 0;
  auto reference_rt = open_runtime(engine_config(roomy_dir.path(), roomy));
  ASSERT_NE(reference_rt, nullptr);
  EngineOptions options = setup.engine;
  options.kv_shadow = std::make_shared<KvShadow>(reference_rt->geometry());
  const RunResult reference = run_engine(*reference_rt, setup.requests, options);
  ASSERT_EQ(reference.outputs.size(), setup.requests.size());
  ASSERT_TRUE(reference_rt->shutdown().ok());

  ScratchDir dir("e2e-random");
  Config config = engine_config(dir.path(), setup.sizes);
  config.policies.eviction = setup.policies.eviction;
  config.policies.write = setup.policies.write;
  config.policies.prefetch.on_late = setup.policies.prefetch.on_late;
  config.policies.prefetch.layer_window = setup.layer_window;
  auto rt = open_runtime(config);
  if (rt == nullptr) GTEST_SKIP() << "the NVMe store cannot be opened here";
  const uint64_t verified_before = options.kv_shadow->verified_rows();
  testing::Auditor auditor(*rt);
  const RunResult r = run_engine(*rt, setup.requests, options);
  EXPECT_EQ(auditor.stop(), "");
  const Status quiet = rt->audit();
  EXPECT_TRUE(quiet.ok()) << quiet.to_string();
  expect_identical(reference.outputs, r.outputs, setup.describe);
  EXPECT_GT(options.kv_shadow->verified_rows(), verified_before);
  EXPECT_EQ(r.runtime.failed_loads, 0u);
  EXPECT_EQ(r.runtime.checksum_failures, 0u);
  EXPECT_EQ(r.runtime.io_errors, 0u);
  EXPECT_EQ(r.runtime.open_sequences, 0u);
  std::printf(
      "steps %llu (windowed %llu), reused %llu, recomputed %llu; pages down to host %llu, "
      "blocks to nvme %llu, pages up to hbm %llu\n",
      (unsigned long long)r.engine.steps, (unsigned long long)r.engine.windowed_steps,
      (unsigned long long)r.engine.reused_tokens, (unsigned long long)r.engine.recomputed_tokens,
      (unsigned long long)r.runtime.demotions[tier_index(Tier::kHost)],
      (unsigned long long)r.runtime.demotions[tier_index(Tier::kNvme)],
      (unsigned long long)r.runtime.promotions[tier_index(Tier::kHbm)]);
  ASSERT_TRUE(rt->shutdown().ok());
}

INSTANTIATE_TEST_SUITE_P(KVTIER_RANDOM_TIERS_NAME, RandomTiers,
                         ::testing::Range(static_cast<uint32_t>(KVTIER_RANDOM_TIERS_FIRST_SEED),
                                          static_cast<uint32_t>(KVTIER_RANDOM_TIERS_FIRST_SEED +
                                                                KVTIER_RANDOM_TIERS_SEEDS)));

}  // namespace
}  // namespace kvtier::e2e
