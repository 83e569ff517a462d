// The default run (`make run`'s workload, about an hour of modeled traffic on one H200) for the
// two baselines the project's claim rests on: kvtier must reuse more and reach first tokens and
// finish prefill sooner than an HBM-only prefix cache. And the scheduler's invariants, audited
// through a run whose host memory is smaller than the working set. Minutes of CPU: labelled slow.
#include <gtest/gtest.h>

#include "run_test_util.hpp"

namespace kvtier::bench::run {
namespace {

TEST(DefaultRun, KvtierBeatsTheHbmOnlyPrefixCache) {
  const PerfModel m = testing::h200_8b();
  auto w = generate_workload("mix", {}, 1, m.sim_geometry().page_tokens);
  ASSERT_TRUE(w.ok());
  VirtualRunOptions o;
  o.hbm_kv_bytes = m.hbm_kv_bytes();
  o.host_bytes = m.gpu().host_kv_bytes;
  o.nvme_bytes = m.gpu().nvme_bytes;
  o.watermarks = {Watermarks{}, Watermarks{}, Watermarks{}};
  const BaselineResult lru = testing::run_or_fail(*w, testing::baseline(m, "hbm_lru"), m, o);
  const BaselineResult kv = testing::run_or_fail(*w, testing::baseline(m, "kvtier"), m, o);
  EXPECT_EQ(kv.completed(), w->requests.size());
  EXPECT_GT(kv.hit_rate(), lru.hit_rate());
  EXPECT_GT(kv.hit_rate(Tier::kNvme), 0.0) << "the corpus should overflow HBM and host";
  EXPECT_LT(kv.ttft_ms().p50, lru.ttft_ms().p50);
  EXPECT_LT(kv.prefill_gpu_ns, lru.prefill_gpu_ns);
  EXPECT_LT(kv.stall_fraction(), 0.05);
}

// 30 chat users on 1 GB of HBM, 2 GB of host memory and 8 GB of NVMe: every tier overflows and
// host memory fills with blocks in use. The page table's audit and each tier's policy
// membership hold after every 61st event of the loop (every event would take many minutes: each
// audit walks the whole table and every allocator), and auditing changes nothing reported.
TEST(AuditedRun, TheSchedulerKeepsItsInvariantsWithHostSmallerThanTheWorkingSet) {
  const PerfModel m = testing::h200_8b();
  auto w =
      generate_workload("chat", {{"users", "30"}, {"turns", "4"}}, 1, m.sim_geometry().page_tokens);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  VirtualRunOptions o = testing::tiny_tiers(m);
  o.hbm_kv_bytes = 1'000'000'000;
  o.host_bytes = 2'000'000'000;
  o.nvme_bytes = 8'000'000'000;
  o.watermarks = {};
  const BaselineResult plain = testing::run_or_fail(*w, testing::baseline(m, "kvtier"), m, o);
  o.audit_every = 61;
  const BaselineResult audited = testing::run_or_fail(*w, testing::baseline(m, "kvtier"), m, o);
  EXPECT_GT(audited.hit_rate(Tier::kNvme), 0.0) << "the workload must overflow host memory";
  EXPECT_EQ(audited.link_bytes, plain.link_bytes);
  EXPECT_EQ(audited.steps, plain.steps);
}

}  // namespace
}  // namespace kvtier::bench::run
