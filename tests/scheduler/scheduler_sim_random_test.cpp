// The scheduler in virtual time under random workloads: 240 seeds, and those a wider sweep found
// (the slow-labelled scheduler_sim_random_wide_test builds this file again for seeds 240 to
// 10,239), over the five eviction and three write policies, each opening, stepping and closing
// sequences at random over small tiers (every fourth with NVMe smaller than the blocks in use). The
// workload never publishes, so memory fills with private pages that cannot go to NVMe and steps
// must trade pages in the last free frames. On every third seed transfers on any link fail now and
// then, NVMe reads and writes hit bad sectors, and now and then a drive dies with a quarter of the
// blocks on NVMe (each drawn from a generator of its own, so the operations are those of the seed
// without failures); reads and writes pause as they fail. After every event of the loop the page
// table passes its audit and each tier's policy tracks exactly the blocks with a ready copy there;
// after every operation no block a sequence references has lost a page (but to a failed read); a
// step is either refused at once or completes, or with failures injected fails once begun
// (kIoError: a load failed; kUnavailable: a failed transfer left it without room;
// kDeadlineExceeded: a read a hung drive holds, whose host frames stay held until it answers); at
// the end every frame is accounted for and the scheduler is idle.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

// The seeds this binary runs: [KVTIER_RANDOM_SEED_FIRST, KVTIER_RANDOM_SEED_END).
#ifndef KVTIER_RANDOM_SEED_FIRST
#define KVTIER_RANDOM_SEED_FIRST 0
#define KVTIER_RANDOM_SEED_END 240
#endif

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::lost_page;
using testing::maybe_hit_a_failing_disk;
using testing::pause_nvme_at_every_failure;
using testing::random_workload_setup;
using testing::SimSetup;
using testing::SimWorld;

class SchedulerRandomWorkload : public ::testing::TestWithParam<int> {};

TEST_P(SchedulerRandomWorkload, NeverBreaksAnInvariant) {
  std::mt19937 rng(static_cast<uint32_t>(GetParam()));
  SimSetup setup = random_workload_setup(GetParam());
  const bool inject_failures = GetParam() % 3 == 2;
  if (inject_failures) pause_nvme_at_every_failure(setup);
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  for (uint32_t p = 0; p < 10; ++p) prompts.push_back(w.prompt(1 + rng() % 6, p, rng() % 3));
  std::vector<SequenceId> open;
  std::mt19937 failures(static_cast<uint32_t>(GetParam()) * 7919u + 1);
  std::mt19937 disk(static_cast<uint32_t>(GetParam()) * 104729u + 7);
  for (int op = 0; op < 300; ++op) {
    if (inject_failures && failures() % 16 == 0) {
      w.port().fail_next(kAllLinks[failures() % kAllLinks.size()], 1);
    }
    if (inject_failures) maybe_hit_a_failing_disk(w, disk);
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 3 || open.empty()) {
      auto s = w.scheduler().open_sequence(prompts[rng() % prompts.size()]);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      open.push_back(s->id);
    } else if (choice < 8) {
      const SequenceId id = open[rng() % open.size()];
      const StepItem item{id, 1 + static_cast<uint32_t>(rng() % 40)};
      auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
      // A step may not fit, and begin_step says so at once (resource_exhausted); one it admits
      // completes, never waiting out the simulation for frames nothing will free, unless an
      // injected failure fails it.
      if (!r.status.ok()) {
        const StatusCode code = r.status.code();
        const bool begun = r.info.id != 0;
        EXPECT_TRUE((!begun && code == StatusCode::kResourceExhausted) ||
                    (begun && inject_failures &&
                     (code == StatusCode::kIoError || code == StatusCode::kUnavailable ||
                      code == StatusCode::kDeadlineExceeded)))
            << "op " << op << ": " << r.status.to_string();
      }
    } else {
      const std::size_t i = rng() % open.size();
      ASSERT_TRUE(w.scheduler().close_sequence(open[i]).ok());
      open.erase(open.begin() + static_cast<long>(i));
    }
    w.settle();
    ASSERT_EQ(w.broken(), "") << "op " << op << " (choice " << choice << ")";
    Status audit = w.table().audit();
    ASSERT_TRUE(audit.ok()) << "op " << op << ": " << audit.to_string();
    Status members = w.scheduler().audit_membership();
    ASSERT_TRUE(members.ok()) << "op " << op << ": " << members.to_string();
    const std::string lost = lost_page(w);
    ASSERT_EQ(lost, "") << "op " << op << " (choice " << choice
                        << "): a referenced block lost a page";
  }
  for (SequenceId id : open) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.port().answer_hung_reads();
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerRandomWorkload,
                         ::testing::Range(KVTIER_RANDOM_SEED_FIRST, KVTIER_RANDOM_SEED_END));
#if KVTIER_RANDOM_SEED_FIRST == 0
// Seeds the wide sweep found breaking the contract, kept in the fast set once fixed: 5715 (a step
// that refilled a block loaded back a page of it demoted for the step's own room, and stalled);
// with failures injected, 269 (a sequence's blocks given up for recompute freed frames, and the
// requests waiting for frames were not told; then a read queued behind a failed read of the same
// block failed with the store's not_found), 401 (a page lost to a failed read, asked for by a
// step already begun, failed it with not_found rather than as the read did) and 1310 (a block in
// use that NVMe refused was planned as one that could go there: with host room for only some of
// its HBM pages none went down, and a step waited for HBM frames for ever) and 9620 (once bad
// sectors were injected too: a copy of a block in use failed, the step's read of it from NVMe
// waited for host frames that host memory full of private pages would never give, and only
// demotions and prefetches were withdrawn then, not the step's read).
INSTANTIATE_TEST_SUITE_P(FoundByTheWideSweep, SchedulerRandomWorkload,
                         ::testing::Values(5715, 269, 401, 1310, 9620));
#endif

}  // namespace
}  // namespace kvtier
