// HBM and host memory both full of pages that must stay in them: private blocks (never published,
// so they cannot go to NVMe, which is addressed by content key), with or without an NVMe tier. Two
// sequences larger than HBM take turns: each step brings one sequence's pages up and sends the
// other's down, which works only if the two tiers trade pages — a page brought up frees its host
// frame for one going down. Past what the tiers hold, a step cannot finish; the engine aborts it,
// and once it closes a sequence every queued move completes and the scheduler is idle again. With
// host memory full of private pages, a prefix on NVMe only still comes up through the frames
// kept for staging.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::expect_tables_valid;
using testing::SimSetup;
using testing::SimWorld;

constexpr uint32_t kFrames = 64;  // HBM and host memory alike

SimSetup full_tiers_setup(bool with_nvme) {
  SimSetup setup;
  setup.hbm_frames = kFrames;
  setup.host_frames = kFrames;
  setup.nvme_extents = with_nvme ? 256 : 0;
  return setup;
}

// Frames private pages may take: with NVMe, host memory keeps two blocks' worth for staging.
uint32_t usable_frames(const SimSetup& s) {
  const uint32_t reserve = s.nvme_extents > 0 ? 2 * s.geometry.layers : 0;
  return s.hbm_frames + s.host_frames - reserve;
}

class FullTiers : public ::testing::TestWithParam<bool> {};

TEST_P(FullTiers, TwoSequencesLargerThanHbmTakeTurns) {
  const SimSetup setup = full_tiers_setup(GetParam());
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  // Sequences of B and B + 1 blocks, plus the block each one's first decoded token opens, fill
  // every usable frame but one block's: 2B + 4 = usable / layers - 1 (both are even).
  const uint32_t blocks = (usable_frames(setup) / layers - 4) / 2;
  ASSERT_GT(blocks * layers, kFrames / 2) << "each sequence must hold more than half of HBM";
  SequenceId seqs[2];
  for (uint32_t i = 0; i < 2; ++i) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    seqs[i] = s->id;
    const StepItem prefill{s->id, (blocks + i) * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  }
  // Decode turn by turn: 12 tokens each, all within the block the first one opened.
  for (int turn = 0; turn < 24; ++turn) {
    const StepItem item{seqs[turn % 2], 1};
    auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "turn " << turn << ": " << r.status.to_string() << "; "
                               << w.scheduler().pending_summary();
    expect_tables_valid(w, r);
    w.settle();
  }
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
  for (SequenceId id : seqs) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}

TEST_P(FullTiers, AStepPastWhatTheTiersHoldFailsAndTheRestMovesOnOnceASequenceCloses) {
  const SimSetup setup = full_tiers_setup(GetParam());
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  // Three sequences of B blocks fill the usable frames but for a few blocks; a fourth sequence
  // appends one block more than that.
  const uint32_t blocks = usable_frames(setup) / layers / 3;
  const uint32_t left = usable_frames(setup) / layers - 3 * blocks;
  std::vector<SequenceId> seqs;
  for (int i = 0; i < 4; ++i) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    seqs.push_back(s->id);
  }
  for (int i = 0; i < 3; ++i) {
    const StepItem prefill{seqs[i], blocks * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "sequence " << i << ": " << r.status.to_string();
  }
  const StepItem too_much{seqs[3], (left + 1) * page_tokens};
  auto failed = w.run_step(std::span(&too_much, 1), kNanosPerMicro);
  EXPECT_EQ(failed.status.code(), StatusCode::kDeadlineExceeded) << failed.status.to_string();
  const std::string pending = w.scheduler().pending_summary();
  EXPECT_NE(pending.find("cannot go to NVMe"), std::string::npos) << pending;
  // The engine closes a sequence: what waited for frames goes on, and the fourth sequence's step
  // (and one more step of each other sequence) runs.
  ASSERT_TRUE(w.scheduler().close_sequence(seqs[0]).ok());
  w.settle();
  for (int i = 1; i < 4; ++i) {
    const StepItem item{seqs[i], 1};
    auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "sequence " << i << ": " << r.status.to_string() << "; "
                               << w.scheduler().pending_summary();
    expect_tables_valid(w, r);
  }
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(w.scheduler().close_sequence(seqs[i]).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
  EXPECT_EQ(w.hbm().free_count(), setup.hbm_frames);
  EXPECT_EQ(w.host().free_count(), setup.host_frames);
}

// Host memory full of private pages (but for the frames kept for NVMe staging), HBM with room: a
// prefix cached on NVMe only still comes up. Its read takes host frames from the reserve, and
// gives them back once the pages are in HBM (they keep their NVMe copy), so the next block's read
// finds them.
TEST(FullHost, APrefixOnNvmeOnlyComesUpThroughTheReserve) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const uint32_t reserve = 2 * layers;
  // The prefix: published and written through to NVMe, then closed.
  constexpr uint32_t kPrefixBlocks = 3;
  const std::vector<BlockKey> prefix = w.prompt(kPrefixBlocks, /*salt=*/1);
  ASSERT_TRUE(w.prefill_and_close(prefix, kNanosPerMicro).ok());
  w.settle();
  // Sequence A's private pages fill host memory but for the reserve: a second sequence that
  // takes all of HBM pushes them there, and closes.
  const uint32_t a_blocks = (kFrames - reserve) / layers;
  for (uint32_t blocks : {a_blocks, kFrames / layers}) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const StepItem prefill{s->id, blocks * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    if (blocks != a_blocks) ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
  }
  ASSERT_EQ(w.host().free_count(), reserve) << w.scheduler().pending_summary();
  for (const BlockKey& key : prefix) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    ASSERT_EQ(info->nvme, CopyState::kReady);
    for (const PageInfo& p : info->pages) ASSERT_EQ(p.host, CopyState::kAbsent);
  }
  // The prefix again, one token more: every block comes up from NVMe.
  auto q = w.scheduler().open_sequence(prefix);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  ASSERT_EQ(q->reused_blocks, kPrefixBlocks);
  const StepItem decode{q->id, 1};
  auto r = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string() << "; " << w.scheduler().pending_summary();
  expect_tables_valid(w, r);
  ASSERT_TRUE(w.scheduler().close_sequence(q->id).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}

INSTANTIATE_TEST_SUITE_P(Nvme, FullTiers, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "WithNvme" : "WithoutNvme");
                         });

}  // namespace
}  // namespace kvtier
