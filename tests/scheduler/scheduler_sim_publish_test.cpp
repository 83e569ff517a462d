// The scheduler in virtual time: how full blocks are published. A shared prefix is stored once
// and deduplicated at publish; windowed steps over private blocks and publishing theirs; a block
// published after its sequence closed still gets the write policy; completion keys name the
// step's blocks, and keys that contradict the prompt publish nothing.
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

TEST(SchedulerSim, SharedPrefixIsStoredOnceAndDeduplicatedAtPublish) {
  SimWorld w(SimSetup{});
  // Two requests with the same 4-block prompt, prefilled concurrently in one batch.
  auto keys = w.prompt(4, 5);
  auto a = w.scheduler().open_sequence(keys);
  auto b = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(a.ok() && b.ok());
  const StepItem batch[2] = {{a->id, 64}, {b->id, 64}};
  auto r = w.run_step(batch, kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(w.scheduler().stats().blocks_published.load(), 4u);
  EXPECT_EQ(w.scheduler().stats().blocks_deduplicated.load(), 4u);
  for (const BlockKey& k : keys) {
    auto info = w.table().lookup(k);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->refcount, 2u) << "both sequences share one copy";
  }
  ASSERT_TRUE(w.scheduler().close_sequence(a->id).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(b->id).ok());
  w.settle();
  EXPECT_EQ(w.table().snapshot().size(), 4u);
  expect_consistent(w);
}

TEST(SchedulerSim, WindowedStepsOverPrivateBlocks) {
  // A sequence opened with no content keys (prefix caching off) grows past HBM: its private
  // blocks must move down like any other, or the first windowed step never becomes ready.
  SimSetup setup;
  setup.geometry.layers = 8;
  setup.hbm_frames = 64;
  setup.host_frames = 4096;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  auto s = w.scheduler().open_sequence({});
  ASSERT_TRUE(s.ok());
  for (int c = 0; c < 8; ++c) {
    const StepItem chunk{s->id, 32};  // 2 pages per step; windowed from 64 / 8 = 8 pages on
    auto r = w.run_step(std::span(&chunk, 1), 20 * kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "step " << c << ": " << r.status.to_string();
    expect_tables_valid(w, r);
  }
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

TEST(SchedulerSim, WindowedStepsPublishTheirBlocks) {
  // A keyed prompt prefilled in chunks that outgrow HBM: every block the windowed steps complete
  // is published and stays cached after the sequence closes.
  SimSetup setup;  // 4 layers
  setup.hbm_frames = 32;
  setup.host_frames = 1024;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  auto keys = w.prompt(20, 1);
  auto s = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(s.ok());
  for (uint32_t c = 0; c < 4; ++c) {
    const StepItem chunk{s->id, 5 * 16};
    const StepCompletion done{
        s->id, std::vector<BlockKey>(keys.begin() + 5 * c, keys.begin() + 5 * c + 5)};
    auto r = w.run_step(std::span(&chunk, 1), kNanosPerMicro, std::span(&done, 1));
    ASSERT_TRUE(r.status.ok()) << "chunk " << c << ": " << r.status.to_string();
  }
  EXPECT_EQ(w.scheduler().stats().blocks_published.load(), 20u);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(keys).blocks, 20u);
  expect_consistent(w);
}

// A block whose publish waits for its transfers (a windowed step still demoting the pages it
// wrote) and whose sequence closes meanwhile is published on its own later: as any other block,
// it is then handed to the write policy (write_through: written to NVMe).
TEST(SchedulerSim, ABlockPublishedAfterItsSequenceClosedGetsTheWritePolicy) {
  SimSetup setup;  // 4 layers
  setup.hbm_frames = 32;
  setup.host_frames = 1024;
  setup.nvme_extents = 256;
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const std::vector<BlockKey> keys = w.prompt(10, 1);
  auto s = w.scheduler().open_sequence({});  // no prompt keys: the blocks are private until full
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 10 * 16};
  const StepCompletion done{s->id, keys};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro, std::span(&done, 1));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_TRUE(r.info.windowed);
  ASSERT_LT(w.scheduler().match(keys).blocks, 10u) << "the last layer's demotions are in flight";
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  ASSERT_EQ(w.scheduler().match(keys).blocks, 10u) << "published once the transfers ended";
  for (const BlockKey& k : keys) {
    auto info = w.table().lookup(k);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->nvme, CopyState::kReady) << to_string(k) << " was not written through";
  }
  expect_consistent(w);
}

TEST(SchedulerSim, CompletionKeysNameTheStepsBlocksFromItsFirst) {
  // Two prompt keys at open, four blocks written: the completion names all four in order (the
  // prompt's two must match), and the two beyond the prompt are published under the keys given.
  SimSetup setup;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  const auto keys = w.prompt(4, 7);
  auto s = w.scheduler().open_sequence(std::span(keys).first(2));
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 4 * 16};
  const StepCompletion done{s->id, keys};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro, std::span(&done, 1));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(keys).blocks, 4u);
  expect_consistent(w);
}

TEST(SchedulerSim, CompletionKeysThatContradictThePromptPublishNothing) {
  SimSetup setup;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  const auto keys = w.prompt(4, 8);
  const auto other = w.prompt(4, 9);
  for (int variant = 0; variant < 2; ++variant) {
    auto s = w.scheduler().open_sequence(std::span(keys).first(2));
    ASSERT_TRUE(s.ok());
    const StepItem item{s->id, 4 * 16};
    // Variant 0: block 0 named by another prompt's key. Variant 1: five keys for four blocks.
    std::vector<BlockKey> given = variant == 0 ? other : keys;
    if (variant == 1) given.push_back(other[0]);
    const StepCompletion done{s->id, given};
    auto r = w.run_step(std::span(&item, 1), kNanosPerMicro, std::span(&done, 1));
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.to_string();
    EXPECT_NE(r.status.message().find(variant == 0 ? "block 0" : "5 full_block_keys"),
              std::string::npos)
        << r.status.to_string();
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
    // The prompt's own blocks were published when written; nothing under the bad names.
    EXPECT_EQ(w.scheduler().match(keys).blocks, 2u);
    EXPECT_EQ(w.scheduler().match(other).blocks, 0u);
    expect_consistent(w);
  }
}

}  // namespace
}  // namespace kvtier
