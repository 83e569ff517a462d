// A whole Runtime over a real NVMe store whose writes fail underneath it (EIO from the I/O backend,
// as a dying disk gives them): the engine's steps all run on memory alone, writing pauses after
// tiers.nvme.pause_after_failed_writes failures in a row, no write reaches the disk while paused,
// /metrics says so, and a shutdown while paused persists nothing and returns.
#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "tests/runtime/metrics_test_util.hpp"
#include "tests/runtime/runtime_test_util.hpp"
#include "tiers/fault_injection.hpp"

namespace kvtier {
namespace {

struct Scrape {
  double paused = -1;
  double pauses = -1;
  double refused = -1;
};

Scrape scrape(const Runtime& rt) {
  const testing::HttpResponse r = testing::http_get(rt.metrics_port(), "/metrics");
  EXPECT_EQ(r.status, 200) << r.error;
  Scrape s;
  s.paused = testing::sample_value(r.body, "kvtier_nvme_writes_paused").value_or(-1);
  s.pauses = testing::sample_value(r.body, "kvtier_nvme_write_pauses_total").value_or(-1);
  s.refused = testing::sample_value(r.body, "kvtier_refused_demotions_total").value_or(-1);
  return s;
}

// Prefills one 8-block prompt of its own, checking the bytes, and closes it.
void prefill_prompt(Runtime& rt, uint32_t seed) {
  const std::vector<uint32_t> tokens = testing::make_tokens(8 * 16, seed);
  auto seq = rt.open_sequence(rt.block_keys(tokens));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  bool bytes_ok = true;
  const Status ran = testing::run_checked_step(
      rt, seq->id, tokens, seq->reused_tokens,
      static_cast<uint32_t>(tokens.size() - seq->reused_tokens), &bytes_ok);
  EXPECT_TRUE(ran.ok()) << "prompt " << seed << ": " << ran.to_string();
  EXPECT_TRUE(bytes_ok) << "prompt " << seed;
  ASSERT_TRUE(rt.close_sequence(seq->id).ok());
}

TEST(RuntimeNvmePause, ADiskThatFailsEveryWriteIsPausedAndTheEngineRunsOnMemory) {
  testing::ScratchDir dir("runtime-nvme-pause");
  Config c = testing::small_config(dir.path());
  c.metrics.listen = "127.0.0.1:0";
  c.tiers.nvme.pause_after_failed_writes = 2;
  c.tiers.nvme.pause_ms = 600'000;  // holds for the whole test
  auto faults = std::make_shared<FaultInjectingIoBackend>();
  TierStackOptions seams;
  seams.io = faults;
  std::unique_ptr<Runtime> rt = testing::open_or_skip(c, seams);
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here (O_DIRECT or io_uring refused)";
  ASSERT_NE(rt->metrics_port(), 0);
  EXPECT_EQ(scrape(*rt).paused, 0.0);
  // Every write from now on fails with EIO.
  faults->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1u << 30, EIO});

  // 8-block prompts, 32 pages each: HBM holds 2 of them and host memory 8, so from the eleventh on
  // blocks leave host memory, and the disk is asked to write them.
  uint32_t seed = 1;
  for (; seed <= 40 && scrape(*rt).paused != 1.0; ++seed) prefill_prompt(*rt, seed);
  Scrape s = scrape(*rt);
  ASSERT_EQ(s.paused, 1.0) << "40 prompts and writing to NVMe never paused";
  EXPECT_EQ(s.pauses, 1.0);
  EXPECT_GE(s.refused, 2.0) << "the failed writes' blocks are refused";

  // While paused, the disk sees no write, and every step still runs.
  const uint64_t writes = faults->requests(IoOpcode::kWrite);
  for (uint32_t more = 0; more < 20; ++more) prefill_prompt(*rt, 1000 + more);
  EXPECT_EQ(faults->requests(IoOpcode::kWrite), writes) << "a write reached the paused disk";
  s = scrape(*rt);
  EXPECT_EQ(s.paused, 1.0);
  EXPECT_EQ(s.pauses, 1.0);
  const RuntimeStats stats = rt->stats();
  EXPECT_EQ(stats.used_bytes[tier_index(Tier::kNvme)], 0u) << "nothing was written to NVMe";
  EXPECT_GT(stats.evictions[tier_index(Tier::kHost)], 0u) << "blocks left host memory, dropped";
  EXPECT_TRUE(rt->audit().ok());
  // A shutdown while paused persists nothing (it says so) and returns.
  EXPECT_TRUE(rt->shutdown().ok());
  EXPECT_EQ(faults->requests(IoOpcode::kWrite), writes);
}

}  // namespace
}  // namespace kvtier
