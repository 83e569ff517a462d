// The scheduler in virtual time when things go wrong: a failed load fails its layer and the block
// is never served; a failed pinned load is loaded again after the abort; ending a step with a
// failed layer aborts it and caches nothing unwritten; a sequence recomputes a block lost to a
// failed read; a failed write is not retried, and a block in use it failed for counts as kept in
// memory; a step that failed writes leave without room fails at once; writes that keep failing
// pause writing to NVMe, for longer each time, until one succeeds, which lets the blocks they
// refused be written again; misuse is reported and changes nothing; an aborted step leaves its
// sequence as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::expect_tables_valid;
using testing::pause_after;
using testing::SimSetup;
using testing::SimWorld;

// 16 HBM frames, 16 host frames and 64 NVMe extents.
SimSetup small_tiers_with_nvme() {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  return setup;
}

// Eight 4-block prompts computed over small_tiers_with_nvme(): the first one's blocks are on
// NVMe only.
void compute_eight_prompts(SimWorld& w, std::vector<std::vector<BlockKey>>& prompts) {
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kNvme)], 4u);
}

TEST(SchedulerSim, AFailedLoadFailsTheLayerAndTheBlockIsNeverServed) {
  const SimSetup setup = small_tiers_with_nvme();
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_NO_FATAL_FAILURE(compute_eight_prompts(w, prompts));
  w.port().fail_next(Link::kNvmeToHost, 1000);
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 4u);
  const StepItem decode{s->id, 1};
  auto r = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kIoError) << r.status.to_string();
  EXPECT_GT(w.scheduler().stats().failed_loads.load(), 0u);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  // The block whose read failed is a miss from now on.
  EXPECT_LT(w.scheduler().match(prompts[0]).blocks, 4u);
  expect_consistent(w);
}

// A read a hung drive holds fails at the I/O timeout (the port abandons it), so the step fails
// then rather than waiting for the drive; the read's host frames stay held, out of every plan,
// until the drive answers, and only then are they free again.
TEST(SchedulerSim, AReadAHungDriveHoldsFailsTheStepAndHoldsItsFramesUntilTheDriveAnswers) {
  const SimSetup setup = small_tiers_with_nvme();
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_NO_FATAL_FAILURE(compute_eight_prompts(w, prompts));
  w.port().hang_next_reads(1);
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  const StepItem decode{s->id, 1};
  auto r = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << r.status.to_string();
  EXPECT_NE(r.status.message().find("abandoned"), std::string::npos) << r.status.to_string();
  ASSERT_EQ(w.port().hung_reads(), 1u);
  // A whole block's read: a frame per layer, held by the table, counted by the audit.
  EXPECT_EQ(w.table().held_frames(Tier::kHost), setup.geometry.layers);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.table().held_frames(Tier::kHost), setup.geometry.layers)
      << "held until the drive answers";
  EXPECT_EQ(w.scheduler().stats().host_frames_held.load(), setup.geometry.layers);
  expect_consistent(w);

  w.port().answer_hung_reads();
  w.settle();
  EXPECT_EQ(w.table().held_frames(Tier::kHost), 0u);
  EXPECT_EQ(w.scheduler().stats().host_frames_held.load(), 0u);
  expect_consistent(w);
  // The block whose read was abandoned is a miss from now on; the others are read as before.
  auto again = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(again.ok());
  EXPECT_LT(again->reused_blocks, 4u);
  const StepItem next{again->id, 1};
  auto r2 = w.run_step(std::span(&next, 1), kNanosPerMicro);
  EXPECT_TRUE(r2.status.ok()) << r2.status.to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(again->id).ok());
  w.settle();
  expect_consistent(w);
}

// A host -> HBM copy that fails while the step has the page pinned leaves the page filling (it
// cannot be aborted while pinned). After the engine aborts the step, a retry must load the page
// again, not take the half-written frame for a page another engine is writing.
TEST(SchedulerSim, AFailedPinnedLoadIsLoadedAgainAfterAbortNotServed) {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kHost)], 4u);
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 4u);
  w.settle();  // open_sequence's prefetches land first: the step's own loads come next
  const uint64_t loads_before = w.port().counters(Link::kHostToHbm).transfers;
  w.port().fail_next(Link::kHostToHbm, 1);
  const StepItem decode{s->id, 1};
  auto failed = w.run_step(std::span(&decode, 1), kNanosPerMicro);  // aborts on failure
  w.settle();
  const uint64_t loads_after_abort = w.port().counters(Link::kHostToHbm).transfers;
  ASSERT_FALSE(failed.status.ok()) << "the prefix was in host memory, so the step must load ("
                                   << loads_after_abort - loads_before << " loads)";
  EXPECT_EQ(failed.status.code(), StatusCode::kIoError) << failed.status.to_string();
  auto retry = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  ASSERT_TRUE(retry.status.ok()) << retry.status.to_string();
  expect_tables_valid(w, retry);
  EXPECT_GE(w.port().counters(Link::kHostToHbm).transfers, loads_after_abort + 1)
      << "the page whose load failed was served without being loaded again";
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// An engine that ends a step whose layer failed (instead of aborting it) must not get the pages
// it could not have written completed: the step is aborted, nothing unwritten becomes cached.
TEST(SchedulerSim, EndingAStepWithAFailedLayerAbortsItAndCachesNothingUnwritten) {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  const std::vector<BlockKey> longer = w.prompt(5, 1);  // prompts[0] and one block more
  ASSERT_EQ(w.scheduler().match(longer).blocks, 4u);
  auto s = w.scheduler().open_sequence(longer);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 4u);
  w.settle();
  w.port().fail_next(Link::kHostToHbm, 1);
  const StepItem item{s->id, 16};  // writes the fifth block, under its content key
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  w.settle();
  uint32_t failed_layer = step->layers;
  for (uint32_t l = 0; l < step->layers && failed_layer == step->layers; ++l) {
    auto ready = w.scheduler().layer_readiness(step->id, l);
    ASSERT_TRUE(ready.ok());
    if (!(*ready)->ready()) failed_layer = l;
  }
  ASSERT_LT(failed_layer, step->layers) << "the prefix was in host memory: a load must fail";
  EXPECT_EQ(w.scheduler().end_layer(step->id, failed_layer).code(),
            StatusCode::kFailedPrecondition);
  const Status ended = w.scheduler().end_step(step->id, {});
  EXPECT_EQ(ended.code(), StatusCode::kFailedPrecondition) << ended.to_string();
  EXPECT_NE(ended.message().find("layer " + std::to_string(failed_layer)), std::string::npos)
      << ended.message();
  EXPECT_EQ(w.scheduler().end_step(step->id, {}).code(), StatusCode::kNotFound) << "aborted";
  w.settle();
  EXPECT_EQ(w.scheduler().match(longer).blocks, 4u) << "an unwritten block became cached";
  // The sequence is as it was: a retry runs and publishes the fifth block.
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.info.items[0].context_tokens, 4u * 16);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(longer).blocks, 5u);
  expect_consistent(w);
}

// A disk that fails every write: each block is tried once, then leaves host memory by being
// dropped (a cache may lose a block); it is not written again and again, and every step runs.
TEST(SchedulerSim, AFailedWriteIsNotRetriedTheBlockIsDropped) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  SimWorld w(setup);
  w.port().fail_next(Link::kHostToNvme, 1000000);
  std::set<BlockKey> blocks;
  for (uint32_t p = 0; p < 8; ++p) {
    const std::vector<BlockKey> keys = w.prompt(4, p + 1);
    blocks.insert(keys.begin(), keys.end());
    auto s = w.scheduler().open_sequence(keys);
    ASSERT_TRUE(s.ok());
    const StepItem item{s->id, 4 * 16};
    ASSERT_TRUE(w.run_step(std::span(&item, 1), kNanosPerMicro).status.ok()) << "prompt " << p;
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
    expect_consistent(w);
  }
  const SimLinkCounters& writes = w.port().counters(Link::kHostToNvme);
  EXPECT_GT(writes.transfers, 0u);
  EXPECT_LE(writes.transfers, blocks.size()) << "a block whose write failed was written again";
  EXPECT_EQ(w.port().nvme_blocks(), 0u);
  EXPECT_GT(w.scheduler().stats().evictions[tier_index(Tier::kHost)].load(), 0u);
  EXPECT_EQ(w.scheduler().stats().refused_demotions.load(), writes.transfers);
}

// Runs 8 prompts of 4 blocks through tiers too small to keep them, so that their blocks go to
// NVMe; `before` may arm failures first.
struct WritesRun {
  uint64_t write_transfers = 0;
  uint64_t blocks_on_nvme = 0;
  uint64_t refused = 0;
  uint64_t retired = 0;
  uint64_t extents_in_service = 0;
};
WritesRun run_prompts_to_nvme(const std::function<void(SimWorld&)>& before) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  SimWorld w(setup);
  before(w);
  for (uint32_t p = 0; p < 8; ++p) {
    auto s = w.scheduler().open_sequence(w.prompt(4, p + 1));
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return {};
    const StepItem item{s->id, 4 * 16};
    EXPECT_TRUE(w.run_step(std::span(&item, 1), kNanosPerMicro).status.ok()) << "prompt " << p;
    EXPECT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
    expect_consistent(w);
  }
  const SchedulerStats& stats = w.scheduler().stats();
  return WritesRun{w.port().counters(Link::kHostToNvme).transfers, w.port().nvme_blocks(),
                   stats.refused_demotions.load(), stats.nvme_retired_extents.load(),
                   w.nvme()->in_service()};
}

// A write that fails on a bad sector retires its extent in the store. The scheduler retires one
// in its own count of extents, and does not refuse the block: written again, it lands on another
// extent, and NVMe ends up holding what it holds when no write fails. Past one extent in 32 the
// store retires none (the disk is failing as a whole), and a failed write refuses its block.
TEST(SchedulerSim, AWriteThatFailsOnABadSectorIsWrittenAgainElsewhere) {
  const WritesRun clean = run_prompts_to_nvme([](SimWorld&) {});
  ASSERT_GT(clean.blocks_on_nvme, 3u);
  const WritesRun bad =
      run_prompts_to_nvme([](SimWorld& w) { w.port().fail_next_writes_on_bad_extents(2); });
  EXPECT_EQ(bad.retired, 2u);
  EXPECT_EQ(bad.extents_in_service, 62u);
  EXPECT_EQ(bad.refused, 0u);
  EXPECT_EQ(bad.blocks_on_nvme, clean.blocks_on_nvme);
  EXPECT_EQ(bad.write_transfers, clean.write_transfers + 2);
  // 64 extents: the third bad sector retires nothing.
  const WritesRun past_the_cap =
      run_prompts_to_nvme([](SimWorld& w) { w.port().fail_next_writes_on_bad_extents(3); });
  EXPECT_EQ(past_the_cap.retired, 2u);
  EXPECT_EQ(past_the_cap.refused, 1u);
  EXPECT_EQ(past_the_cap.blocks_on_nvme, clean.blocks_on_nvme - 1);
  // A failure that retires nothing refuses its block, as before.
  const WritesRun failed =
      run_prompts_to_nvme([](SimWorld& w) { w.port().fail_next(Link::kHostToNvme, 3); });
  EXPECT_EQ(failed.retired, 0u);
  EXPECT_EQ(failed.refused, 3u);
  EXPECT_EQ(failed.blocks_on_nvme, clean.blocks_on_nvme - 3);
}

// A block a sequence reuses whose read from NVMe fails is never served (its NVMe copy goes), and
// with no other copy the sequence has lost it: its next step gives that block and those after it
// back for the engine to recompute (recomputed_tokens), instead of failing every step after.
TEST(SchedulerSim, ASequenceRecomputesABlockLostToAFailedRead) {
  SimSetup setup;
  SimWorld w(setup);
  const std::vector<BlockKey> prefix = w.prompt(2, 1);
  for (const BlockKey& k : prefix) {  // on NVMe only, as a restart's recovered index has them
    w.port().store_on_nvme(k);
    ASSERT_TRUE(w.scheduler().adopt_nvme_block(k).ok());
  }
  w.port().fail_next(Link::kNvmeToHost, 1);
  auto s = w.scheduler().open_sequence(prefix);  // starts reading the prefix; one read fails
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 2u);
  w.settle();
  EXPECT_EQ(w.scheduler().stats().failed_loads.load(), 1u);
  const StepItem item{s->id, 1};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const StepItemInfo& info = r.info.items[0];
  EXPECT_GT(info.recomputed_tokens, 0u);
  EXPECT_EQ(info.context_tokens + info.recomputed_tokens, 2u * 16) << "the engine's count";
  expect_tables_valid(w, r);
  // The next step reads what this one wrote: nothing is owed any more.
  auto r2 = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r2.status.ok()) << r2.status.to_string();
  EXPECT_EQ(r2.info.items[0].recomputed_tokens, 0u);
  EXPECT_EQ(r2.info.items[0].context_tokens, 2u * 16 + 1);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(prefix).blocks, 2u) << "the recomputed prefix is cached again";
  expect_consistent(w);
}

// Tiers for kPrompts one-block prompts held open: HBM takes 4 blocks, host memory 16, of which 2
// are its staging reserve, so the prompts fill what host memory keeps for pages.
constexpr uint32_t kPrompts = 14;
SimSetup host_for_prompts_setup(WritePolicy write) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 64;
  setup.nvme_extents = 64;
  setup.policies.write = write;
  return setup;
}

// A block in use whose NVMe write failed is never sent there again: like a private block, its
// pages stay in HBM or host memory while it is in use, and begin_step counts it among the blocks
// kept in memory (counted as bound for NVMe, steps were admitted into frames that never came and
// waited out their timeout: the random serving simulation with write failures stalled so).
TEST(SchedulerSim, ABlockInUseWhoseWriteFailedCountsAsKeptInMemory) {
  SimWorld w(host_for_prompts_setup(WritePolicy::kWriteThrough));
  w.port().fail_next(Link::kHostToNvme, 1000000);
  // One-block prompts, each written through and refused by NVMe, their sequences open.
  std::vector<SequenceId> open;
  Status held = w.hold_prompts(kPrompts, kNanosPerMicro, open);
  ASSERT_TRUE(held.ok()) << held.to_string();
  ASSERT_EQ(w.scheduler().stats().refused_demotions.load(), kPrompts);
  // A prefill one layer of which does not fit in HBM is refused at once; what it says counts
  // the refused blocks among those memory must keep.
  auto s = w.scheduler().open_sequence(w.prompt(20, 99));
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 20 * 16};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted) << r.status.to_string();
  EXPECT_NE(r.status.message().find("in all " + std::to_string(kPrompts) + " blocks"),
            std::string::npos)
      << r.status.to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  for (SequenceId id : open) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

// The scenario of the next two tests: one-block prompts held open fill host memory, unwritten;
// every write to NVMe fails from then on, and an 8-block prefill that fits two layers at a time
// (its pages of the others going to host memory once those blocks are written to NVMe) is left
// without the room it was admitted with. `check` looks at the failed step (the harness aborted
// it); begun again, the step must be refused at once or fit.
void run_a_step_failed_writes_leave_without_room(
    const SimSetup& setup,
    const std::function<void(SimWorld&, const SimWorld::StepResult&)>& check) {
  SimWorld w(setup);
  std::vector<SequenceId> open;
  Status held = w.hold_prompts(kPrompts, kNanosPerMicro, open);
  ASSERT_TRUE(held.ok()) << held.to_string();
  ASSERT_EQ(w.scheduler().stats().refused_demotions.load(), 0u);
  w.port().fail_next(Link::kHostToNvme, 1000000);
  auto s = w.scheduler().open_sequence(w.prompt(8, 99));
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 8 * 16};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.info.windowed);
  EXPECT_EQ(r.info.window, 2u);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.to_string();
  EXPECT_NE(r.status.message().find("no longer fits in HBM"), std::string::npos)
      << r.status.to_string();
  check(w, r);
  expect_consistent(w);
  auto again = w.run_step(std::span(&item, 1), kNanosPerMicro);
  EXPECT_TRUE(again.status.ok() ||
              (again.info.id == 0 && again.status.code() == StatusCode::kResourceExhausted))
      << again.status.to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  for (SequenceId id : open) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

// A step admitted beside blocks in use that were bound for NVMe, whose writes then fail while
// the step makes room: those blocks must stay in memory, and the frames the step's window counted
// on are no longer there. Its unfinished layers fail at once with kUnavailable, saying why, rather
// than waiting out the timeout for frames no move can free; begun again, the step is refused at
// once or fits.
TEST(SchedulerSim, AStepThatFailedWritesLeaveWithoutRoomFailsAtOnce) {
  run_a_step_failed_writes_leave_without_room(
      host_for_prompts_setup(WritePolicy::kWriteBack),
      [](SimWorld& w, const SimWorld::StepResult& r) {
        EXPECT_NE(r.status.message().find("injected failure"), std::string::npos)
            << "names the failed write: " << r.status.to_string();
        EXPECT_GT(w.scheduler().stats().refused_demotions.load(), 0u);
      });
}

// Writes to NVMe that fail in a row pause writing there: each pause and its length, in virtual
// time, from the scheduler's gauge as the loop runs prompts through tiers too small to hold them,
// one every 5 ms.
struct PauseLog {
  std::vector<Nanos> lengths;  // of every pause that ended
  uint64_t writes_while_paused = 0;
  uint64_t writes = 0;
  bool paused_at_end = false;
  uint64_t blocks_on_nvme = 0;  // at the end
};
PauseLog run_prompts_with_failing_writes(const NvmePauseOptions& pause, uint32_t failures,
                                         uint32_t prompts) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  setup.nvme_write_pause = pause;
  SimWorld w(setup);
  w.port().fail_next(Link::kHostToNvme, failures);
  PauseLog log;
  bool paused = false;
  Nanos since = 0;
  uint64_t writes_seen = 0;
  w.loop().after_each_event([&] {
    const uint64_t writes = w.port().counters(Link::kHostToNvme).transfers;
    const bool now_paused = w.scheduler().stats().nvme_writes_paused.load() != 0;
    // Writes submitted by an event the pause held throughout.
    if (paused && now_paused) log.writes_while_paused += writes - writes_seen;
    writes_seen = writes;
    if (now_paused != paused) {
      if (paused) log.lengths.push_back(w.loop().clock().now() - since);
      since = w.loop().clock().now();
      paused = now_paused;
    }
  });
  for (uint32_t p = 0; p < prompts; ++p) {
    auto s = w.scheduler().open_sequence(w.prompt(4, p + 1));
    EXPECT_TRUE(s.ok());
    if (!s.ok()) break;
    const StepItem item{s->id, 4 * 16};
    const Status ran = w.run_step(std::span(&item, 1), kNanosPerMicro).status;
    EXPECT_TRUE(ran.ok()) << "prompt " << p << ": " << ran.to_string();
    EXPECT_TRUE(w.scheduler().close_sequence(s->id).ok());
    // The next request comes 5 ms later (settling would run every pause out between prompts).
    w.loop().run_until(w.loop().clock().now() + 5 * kNanosPerMilli);
  }
  w.settle();
  w.loop().after_each_event({});
  log.writes = w.port().counters(Link::kHostToNvme).transfers;
  log.paused_at_end = paused;
  log.blocks_on_nvme = w.port().nvme_blocks();
  EXPECT_EQ(w.scheduler().stats().nvme_write_pauses.load(), log.lengths.size() + (paused ? 1 : 0));
  expect_consistent(w);
  return log;
}

// A disk that fails every write: three failures in a row pause writing for 10 ms, and each pause
// whose first write fails again is twice as long, up to 40 ms. No write starts while paused, and
// every step runs (the blocks that cannot go down are dropped, or stay in memory while in use).
// Without the pause every block that leaves host memory is tried once.
TEST(SchedulerSim, WritesThatKeepFailingPauseForLongerEachTime) {
  const PauseLog paused = run_prompts_with_failing_writes(pause_after(3), 1000000, 24);
  ASSERT_GE(paused.lengths.size(), 4u);
  const Nanos ms = kNanosPerMilli;
  EXPECT_EQ(paused.lengths[0], 10 * ms);
  EXPECT_EQ(paused.lengths[1], 20 * ms);
  EXPECT_EQ(paused.lengths[2], 40 * ms);
  EXPECT_EQ(paused.lengths[3], 40 * ms);
  EXPECT_EQ(paused.writes_while_paused, 0u);
  EXPECT_EQ(paused.blocks_on_nvme, 0u);
  const PauseLog never = run_prompts_with_failing_writes(pause_after(0), 1000000, 24);
  EXPECT_TRUE(never.lengths.empty());
  EXPECT_LT(paused.writes, never.writes) << "the pauses spared the failing disk no write";
}

// A disk that recovers: after five failures writes succeed again, the outage ends with the first
// of them, and blocks reach NVMe as before.
TEST(SchedulerSim, WritesResumeWhenTheDiskRecovers) {
  const PauseLog log = run_prompts_with_failing_writes(pause_after(3), 5, 24);
  ASSERT_FALSE(log.lengths.empty()) << "three failures in a row paused writing";
  EXPECT_EQ(log.writes_while_paused, 0u);
  EXPECT_GT(log.writes, 8u) << "writes went on after the failures";
  EXPECT_FALSE(log.paused_at_end);
  EXPECT_GT(log.blocks_on_nvme, 0u);
}

// A step admitted beside blocks in use bound for NVMe fails at once when writing there pauses,
// saying so (the pause leaves every block in use in memory); begun again while paused, it is
// counted with every block in use kept in memory.
TEST(SchedulerSim, AStepThatAPauseLeavesWithoutRoomFailsAtOnceSayingWhy) {
  SimSetup setup = host_for_prompts_setup(WritePolicy::kWriteBack);
  setup.nvme_write_pause = pause_after(1);
  run_a_step_failed_writes_leave_without_room(
      setup, [](SimWorld& w, const SimWorld::StepResult& r) {
        EXPECT_NE(
            r.status.message().find("writes to NVMe are paused for 10 ms after 1 failed in a row"),
            std::string::npos)
            << r.status.to_string();
        EXPECT_EQ(w.scheduler().stats().nvme_writes_paused.load(), 1u);
      });
}

// Blocks whose writes failed while the disk was failing may be written again once it works: the
// first write to succeed after a pause lifts those refusals. Three one-block prompts held open are
// refused by the three failures that pause writing; the disk then recovers and the next prompts'
// writes succeed. Closed and pushed out of memory, the three go to NVMe and stay cached, where a
// refused block is dropped.
TEST(SchedulerSim, BlocksRefusedByAFailingDiskAreWrittenOnceItWorksAgain) {
  SimSetup setup = host_for_prompts_setup(WritePolicy::kWriteThrough);
  setup.nvme_write_pause = pause_after(3);
  SimWorld w(setup);
  w.port().fail_next(Link::kHostToNvme, 3);
  std::vector<SequenceId> open;
  Status held = w.hold_prompts(kPrompts, kNanosPerMicro, open);
  ASSERT_TRUE(held.ok()) << held.to_string();
  ASSERT_EQ(w.scheduler().stats().refused_demotions.load(), 3u);
  ASSERT_EQ(w.scheduler().stats().nvme_write_pauses.load(), 1u);
  ASSERT_EQ(w.scheduler().stats().nvme_writes_paused.load(), 0u) << "the outage ended";
  for (SequenceId id : open) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  // Prompts of their own push every held block out of memory.
  for (uint32_t p = 0; p < 8; ++p) {
    ASSERT_TRUE(w.prefill_and_close(w.prompt(4, 100 + p), kNanosPerMicro).ok());
    w.settle();
  }
  uint32_t cached = 0;
  for (uint32_t p = 0; p < kPrompts; ++p) {
    const MatchResult m = w.scheduler().match(w.prompt(1, p + 1));
    EXPECT_EQ(m.by_tier[tier_index(Tier::kHbm)] + m.by_tier[tier_index(Tier::kHost)], 0u);
    cached += m.by_tier[tier_index(Tier::kNvme)];
  }
  EXPECT_EQ(cached, kPrompts) << "a block the failing disk refused was dropped, not written";
  expect_consistent(w);
}

// A block the store already holds (written by an earlier runtime, not adopted by this one): the
// store answers the write with kAlreadyExists, which counts as written — the block is on NVMe,
// not refused and dropped.
TEST(SchedulerSim, AWriteTheStoreAlreadyHoldsCountsAsWritten) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  SimWorld w(setup);
  const std::vector<BlockKey> first = w.prompt(4, 1);
  for (const BlockKey& k : first) w.port().store_on_nvme(k);
  for (uint32_t p = 0; p < 8; ++p) {
    auto s = w.scheduler().open_sequence(p == 0 ? first : w.prompt(4, p + 1));
    ASSERT_TRUE(s.ok());
    const StepItem item{s->id, 4 * 16};
    ASSERT_TRUE(w.run_step(std::span(&item, 1), kNanosPerMicro).status.ok()) << "prompt " << p;
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
    expect_consistent(w);
  }
  EXPECT_EQ(w.scheduler().stats().refused_demotions.load(), 0u);
  const MatchResult m = w.scheduler().match(first);
  EXPECT_EQ(m.blocks, 4u) << "the first prompt left memory and is still cached on NVMe";
  EXPECT_GT(m.by_tier[tier_index(Tier::kNvme)], 0u);
}

TEST(SchedulerSim, MisuseIsReportedAndChangesNothing) {
  SimWorld w(SimSetup{});
  EXPECT_EQ(w.scheduler().close_sequence(99).code(), StatusCode::kNotFound);
  const StepItem ghost{99, 1};
  EXPECT_EQ(w.scheduler().begin_step(std::span(&ghost, 1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(w.scheduler().begin_step({}).status().code(), StatusCode::kInvalidArgument);
  auto s = w.scheduler().open_sequence(w.prompt(2, 1));
  ASSERT_TRUE(s.ok());
  const StepItem twice[2] = {{s->id, 1}, {s->id, 1}};
  EXPECT_EQ(w.scheduler().begin_step(twice).status().code(), StatusCode::kInvalidArgument);
  const StepItem one{s->id, 32};
  auto step = w.scheduler().begin_step(std::span(&one, 1));
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(w.scheduler().begin_step(std::span(&one, 1)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.scheduler().close_sequence(s->id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.scheduler().end_layer(step->id, 99).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(w.scheduler().end_step(step->id + 7, {}).code(), StatusCode::kNotFound);
  w.settle();
  ASSERT_TRUE(w.scheduler().end_layer(step->id, 0).ok());
  EXPECT_EQ(w.scheduler().end_layer(step->id, 0).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  EXPECT_EQ(w.scheduler().end_step(step->id, {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(w.scheduler().wait_layer(step->id, 0).code(), StatusCode::kNotFound);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

TEST(SchedulerSim, AbortedStepLeavesTheSequenceAsItWas) {
  SimWorld w(SimSetup{});
  auto s = w.scheduler().open_sequence(w.prompt(4, 1));
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 40};
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok());
  w.settle();
  const uint32_t used_during = w.hbm().used();
  EXPECT_GT(used_during, 0u);
  ASSERT_TRUE(w.scheduler().abort_step(step->id).ok());
  w.settle();
  EXPECT_EQ(w.hbm().used(), 0u) << "pages made for the aborted step must be freed";
  const StepItem again{s->id, 64};
  auto r = w.run_step(std::span(&again, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.info.items[0].context_tokens, 0u);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

}  // namespace
}  // namespace kvtier
