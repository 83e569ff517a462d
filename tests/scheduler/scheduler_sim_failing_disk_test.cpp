// The scheduler in virtual time over a failing disk. Failed reads in a row pause reading from
// NVMe; while paused, prompts recompute the blocks cached only there instead of failing on them,
// and hints read none; after the pause the first read decides (a failure pauses again at once, a
// success ends the outage). Blocks the store loses with a dead drive are forgotten before a
// prompt reuses one, or, when one is being read, once that read ends.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::pause_after;
using testing::SimSetup;
using testing::SimWorld;

constexpr Nanos kMs = kNanosPerMilli;
constexpr uint32_t kPromptBlocks = 4;

// Prompts of four blocks computed until the first few are cached on NVMe only.
class FailingDisk {
 public:
  explicit FailingDisk(const NvmePauseOptions& pause = {},
                       uint64_t max_inflight_bytes = SimSetup{}.max_inflight_bytes)
      : w_(setup(pause, max_inflight_bytes)) {
    EXPECT_TRUE(w_.compute_prompts(8, kPromptBlocks, kNanosPerMicro, prompts_).ok());
    for (uint32_t p = 0; p < 4; ++p) {
      EXPECT_EQ(w_.scheduler().match(prompts_[p]).by_tier[tier_index(Tier::kNvme)], kPromptBlocks)
          << "prompt " << p << " is cached on NVMe only";
    }
  }

  SimWorld& world() { return w_; }
  std::span<const BlockKey> prompt(uint32_t p) const { return prompts_[p]; }

  struct Prompt {
    Status step;
    uint32_t reused_from_nvme = 0;
    uint32_t recomputed = 0;
  };
  // Opens prompt `p`, runs one step computing what it does not reuse and one token more, closes
  // it, and lets virtual time run 1 ms on (not past a pause).
  Prompt run(uint32_t p) {
    Prompt out;
    auto s = w_.scheduler().open_sequence(prompts_[p]);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return out;
    out.reused_from_nvme = s->reused_by_tier[tier_index(Tier::kNvme)];
    out.recomputed = s->recompute_blocks;
    const StepItem item{s->id, (kPromptBlocks - s->reused_blocks) * 16 + 1};
    out.step = w_.run_step(std::span(&item, 1), kNanosPerMicro).status;
    EXPECT_TRUE(w_.scheduler().close_sequence(s->id).ok());
    wait(kMs);
    return out;
  }
  // Hints prompt `p` as a waiting request's; returns how many NVMe reads started by then.
  uint64_t hint(uint32_t p) {
    const HintedRequest r{p, 0, prompts_[p]};
    EXPECT_TRUE(w_.scheduler().hint(std::span(&r, 1)).ok());
    wait(kMs);
    return reads();
  }
  uint64_t reads() { return w_.port().counters(Link::kNvmeToHost).transfers; }
  void wait(Nanos t) { w_.loop().run_until(w_.loop().clock().now() + t); }
  uint64_t pauses() { return w_.scheduler().stats().nvme_read_pauses.load(); }
  bool paused() { return w_.scheduler().stats().nvme_reads_paused.load() != 0; }
  // Blocks of the first `prompts` prompts the table has a ready NVMe copy of.
  uint64_t nvme_copies(uint32_t prompts) {
    uint64_t n = 0;
    for (uint32_t p = 0; p < prompts; ++p) {
      for (const BlockKey& key : prompts_[p]) {
        bool ready = false;
        w_.table()
            .visit(
                key,
                [&](const EntryView& v) { ready = v.state(CopyId::nvme()) == CopyState::kReady; })
            .ignore();
        n += ready;
      }
    }
    return n;
  }

  uint64_t lost() { return w_.scheduler().stats().nvme_blocks_lost.load(); }
  // Every block the table has a ready NVMe copy of is on the simulated disk.
  void expect_nvme_copies_on_disk() {
    for (const auto& [key, info] : w_.table().snapshot()) {
      if (info.nvme == CopyState::kReady) {
        EXPECT_TRUE(w_.port().on_nvme(key)) << to_string(key) << " is not on NVMe any more";
      }
    }
  }

 private:
  static SimSetup setup(const NvmePauseOptions& pause, uint64_t max_inflight_bytes) {
    SimSetup s;
    s.max_inflight_bytes = max_inflight_bytes;
    s.hbm_frames = 16;
    s.host_frames = 16;
    s.nvme_extents = 64;
    s.nvme_read_pause = pause;
    return s;
  }

  SimWorld w_;
  std::vector<std::vector<BlockKey>> prompts_;
};

// A disk whose every read fails. The first prompt's four reads fail its step and pause reading
// (three in a row); the next prompt then recomputes its four blocks and runs, and a hint reads
// nothing. Past the pause the first read fails again and pauses again at once. Without the pause
// the second prompt reuses its blocks from NVMe and fails like the first.
TEST(SchedulerSim, ReadsThatKeepFailingPauseAndPromptsRecomputeInstead) {
  FailingDisk r(pause_after(3));
  r.world().port().fail_next(Link::kNvmeToHost, 1'000'000);
  const FailingDisk::Prompt first = r.run(0);
  EXPECT_EQ(first.reused_from_nvme, kPromptBlocks);
  EXPECT_EQ(first.step.code(), StatusCode::kIoError) << first.step.to_string();
  EXPECT_TRUE(r.paused());
  EXPECT_EQ(r.pauses(), 1u);
  const uint64_t reads = r.reads();
  const FailingDisk::Prompt second = r.run(1);
  EXPECT_EQ(second.reused_from_nvme, 0u);
  EXPECT_EQ(second.recomputed, kPromptBlocks);
  EXPECT_TRUE(second.step.ok()) << second.step.to_string();
  EXPECT_EQ(r.reads(), reads) << "no read from NVMe starts while reads are paused";
  EXPECT_EQ(r.hint(3), reads) << "not even for a hint";
  r.wait(10 * kMs);
  EXPECT_FALSE(r.paused());
  const FailingDisk::Prompt third = r.run(2);
  EXPECT_EQ(third.reused_from_nvme, kPromptBlocks);
  EXPECT_EQ(third.step.code(), StatusCode::kIoError) << third.step.to_string();
  EXPECT_TRUE(r.paused()) << "the first read after the pause failed: paused again";
  EXPECT_EQ(r.pauses(), 2u);
  r.world().settle();
  expect_consistent(r.world());

  FailingDisk never(pause_after(0));
  never.world().port().fail_next(Link::kNvmeToHost, 1'000'000);
  EXPECT_EQ(never.run(0).step.code(), StatusCode::kIoError);
  const FailingDisk::Prompt unpaused = never.run(1);
  EXPECT_EQ(unpaused.reused_from_nvme, kPromptBlocks);
  EXPECT_EQ(unpaused.step.code(), StatusCode::kIoError) << "every prompt pays for the dead disk";
  const uint64_t before_hint = never.reads();
  EXPECT_GT(never.hint(3), before_hint) << "a hint reads from NVMe";
  EXPECT_EQ(never.pauses(), 0u);
  never.world().settle();
  expect_consistent(never.world());
}

// Hints queue sixteen block reads behind one another (the link takes one at a time) on a disk
// that fails every read. The first two fail and pause reading; the fourteen still queued end
// unstarted: they never reach the disk, and their blocks keep their NVMe copies for after the
// pause (each failed read drops its block's). Without the pause all sixteen are read and lost.
TEST(SchedulerSim, PrefetchesQueuedWhenReadsPauseNeverReachTheDisk) {
  for (const bool pause : {true, false}) {
    SCOPED_TRACE(pause ? "reads pause" : "reads never pause");
    FailingDisk r(pause_after(pause ? 2 : 0), /*max_inflight_bytes=*/1);
    ASSERT_EQ(r.nvme_copies(4), 4 * kPromptBlocks);
    r.world().port().fail_next(Link::kNvmeToHost, 1'000'000);
    std::vector<HintedRequest> waiting;
    for (uint32_t p = 0; p < 4; ++p) {
      const std::span<const BlockKey> keys = r.prompt(p);
      waiting.push_back({p, 0, std::vector<BlockKey>(keys.begin(), keys.end())});
    }
    ASSERT_TRUE(r.world().scheduler().hint(waiting).ok());
    r.world().settle();
    const uint64_t read = pause ? 2 : 4 * kPromptBlocks;
    EXPECT_EQ(r.pauses(), pause ? 1u : 0u);
    EXPECT_EQ(r.reads(), read) << "reads that reached the disk";
    EXPECT_EQ(r.nvme_copies(4), 4 * kPromptBlocks - read) << "blocks that kept their NVMe copy";
    r.expect_nvme_copies_on_disk();
    expect_consistent(r.world());
  }
}

// A disk that recovers: its first four reads fail (the first prompt's), and past the pause the
// next prompt reuses its blocks from NVMe again, the outage over.
TEST(SchedulerSim, ReadsResumeWhenTheDiskRecovers) {
  FailingDisk r(pause_after(3));
  r.world().port().fail_next(Link::kNvmeToHost, kPromptBlocks);
  EXPECT_EQ(r.run(0).step.code(), StatusCode::kIoError);
  EXPECT_TRUE(r.paused());
  r.wait(10 * kMs);
  const FailingDisk::Prompt next = r.run(1);
  EXPECT_EQ(next.reused_from_nvme, kPromptBlocks);
  EXPECT_TRUE(next.step.ok()) << next.step.to_string();
  EXPECT_FALSE(r.paused());
  EXPECT_EQ(r.pauses(), 1u);
  r.world().settle();
  expect_consistent(r.world());
}

// A drive dies and takes the first prompt's blocks (and 16 extents) with it. The next prompt the
// engine opens makes the scheduler forget them first: the first prompt asked again reuses none,
// reads nothing, recomputes its blocks and runs.
TEST(SchedulerSim, BlocksLostWithADeadDriveAreForgottenBeforeAPromptReusesThem) {
  FailingDisk d;
  const uint64_t reads = d.reads();
  d.world().port().lose_nvme_blocks(d.prompt(0), 16);
  const FailingDisk::Prompt again = d.run(0);
  EXPECT_EQ(again.reused_from_nvme, 0u);
  EXPECT_TRUE(again.step.ok()) << again.step.to_string();
  EXPECT_EQ(d.reads(), reads) << "no read of a lost block";
  EXPECT_EQ(d.lost(), kPromptBlocks);
  EXPECT_EQ(d.world().scheduler().stats().nvme_retired_extents.load(), 16u);
  d.expect_nvme_copies_on_disk();
  d.world().settle();
  expect_consistent(d.world());
}

// A drive dies with 16 of the 64 extents, and the table retires as many; once the store readmits
// it, the next prompt opened puts them back in service, and NVMe holds more blocks than the 48
// left while the drive was out.
TEST(SchedulerSim, ExtentsOfAReadmittedDriveComeBackInService) {
  FailingDisk d;
  d.world().port().lose_nvme_blocks(d.prompt(0), 16);
  EXPECT_TRUE(d.run(0).step.ok());
  const auto retired = [&] { return d.world().scheduler().stats().nvme_retired_extents.load(); };
  EXPECT_EQ(retired(), 16u);
  d.world().port().readmit_nvme_extents(16);
  EXPECT_TRUE(d.run(1).step.ok());
  EXPECT_EQ(retired(), 0u);
  std::vector<std::vector<BlockKey>> more;
  ASSERT_TRUE(d.world().compute_prompts(24, kPromptBlocks, kNanosPerMicro, more).ok());
  EXPECT_GT(d.world().port().nvme_blocks(), 48u);
  d.expect_nvme_copies_on_disk();
  expect_consistent(d.world());
}

// The first prompt's blocks are read from NVMe, and the drive dies as the first of those reads
// starts; the scheduler hears of it at once (another prompt opens). It forgets at once the blocks
// whose reads have not started, and the one being read as its read ends. The first prompt's step
// fails (kUnavailable: blocks it reuses left NVMe before their reads started) and, begun again,
// recomputes them.
TEST(SchedulerSim, ABlockLostWhileItIsReadIsForgottenOnceTheReadEnds) {
  FailingDisk d;
  auto first = d.world().scheduler().open_sequence(d.prompt(0));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->reused_by_tier[tier_index(Tier::kNvme)], kPromptBlocks);
  const uint64_t reads = d.reads();
  std::optional<Result<OpenedSequence>> second;
  uint64_t lost_then = 0;
  d.world().loop().after_each_event([&] {
    if (second.has_value() || d.reads() == reads) return;
    d.world().port().lose_nvme_blocks(d.prompt(0), 0);
    second = d.world().scheduler().open_sequence(d.prompt(1));
    lost_then = d.lost();
  });
  const StepItem decode{first->id, 1};
  const Status ran = d.world().run_step(std::span(&decode, 1), kNanosPerMicro).status;
  d.world().loop().after_each_event({});
  EXPECT_EQ(ran.code(), StatusCode::kUnavailable) << ran.to_string();
  EXPECT_NE(ran.message().find("left NVMe before this read of it started"), std::string::npos);
  // Begun again, the step recomputes what it lost.
  const testing::SimWorld::StepResult again =
      d.world().run_step(std::span(&decode, 1), kNanosPerMicro);
  EXPECT_TRUE(again.status.ok()) << again.status.to_string();
  EXPECT_GT(again.info.items[0].recomputed_tokens, 0u);
  ASSERT_TRUE(second.has_value() && second->ok());
  EXPECT_GT(lost_then, 0u) << "the blocks whose reads had not started are forgotten at once";
  EXPECT_LT(lost_then, kPromptBlocks) << "the block being read is not";
  EXPECT_EQ(d.lost(), kPromptBlocks) << "forgotten as its read ended";
  auto third = d.world().scheduler().open_sequence(d.prompt(2));
  ASSERT_TRUE(third.ok());
  d.expect_nvme_copies_on_disk();
  for (SequenceId id : {first->id, (*second)->id, third->id}) {
    ASSERT_TRUE(d.world().scheduler().close_sequence(id).ok());
  }
  d.world().settle();
  expect_consistent(d.world());
}

}  // namespace
}  // namespace kvtier
