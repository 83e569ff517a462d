// The scheduler in virtual time: how loads are ordered and when they are worth it. Demand loads
// move ahead of queued prefetches (NVMe reads, frames in hand, HBM frame requests); a late prefix
// given up for recompute is not waited for; a load overtaken by a refill waits for the engine's
// write; prefetch hides transfers when links carry twice the demand, and is counted by its lead;
// compute-or-load recomputes what is slower to load, and says so again after a failed step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::expect_tables_valid;
using testing::SimSetup;
using testing::SimWorld;

// A step that needs blocks whose whole-block NVMe reads were queued as prefetches (open_sequence
// prefetches the reused prefix), still waiting for host frames or for the link, moves those reads
// ahead of other queued prefetches: with one job in flight per link, the second sequence's first
// layer is ready while the first sequence's prefetches still wait behind it.
TEST(SchedulerSim, ADemandMovesItsQueuedNvmeBlockReadsAheadOfPrefetches) {
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = 64;
  setup.nvme_extents = 256;
  setup.max_inflight_bytes = 1;  // one job in flight per link at a time
  SimWorld n(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(n.compute_prompts(12, 4, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(n.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kNvme)], 4u);
  ASSERT_EQ(n.scheduler().match(prompts[1]).by_tier[tier_index(Tier::kNvme)], 4u);
  auto a = n.scheduler().open_sequence(prompts[0]);  // 4 block reads queued, as prefetches
  auto b = n.scheduler().open_sequence(prompts[1]);  // 4 more behind them
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->reused_blocks, 4u);
  ASSERT_EQ(b->reused_blocks, 4u);
  const StepItem item{b->id, 1};
  auto step = n.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  auto first = n.scheduler().layer_readiness(step->id, 0);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(n.loop().run_while_not([&] { return (*first)->finished(); }));
  ASSERT_TRUE((*first)->wait(0).ok());
  EXPECT_GT(n.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kNvme)], 0u)
      << "the first sequence's prefetches all ran before the step's demand";
  ASSERT_TRUE(n.scheduler().abort_step(step->id).ok());
  for (auto id : {a->id, b->id}) ASSERT_TRUE(n.scheduler().close_sequence(id).ok());
  n.settle();
  expect_consistent(n);
}

// A block every page of which is in HBM is read by the step from HBM: begin_step's whole-block
// reads from NVMe are for blocks that have pages nowhere in memory, not for one that host memory
// merely lacks. Here host memory holds one block, so write-through leaves the prompt's blocks in
// HBM and on NVMe with no host copy; reading them up again took NVMe bandwidth and host frames,
// at demand priority, from the loads steps were waiting for.
TEST(SchedulerSim, AStepOverBlocksResidentInHbmReadsNothingFromNvme) {
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = 4;  // one block of 4 layers
  setup.nvme_extents = 64;
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld n(setup);
  const std::vector<BlockKey> keys = n.prompt(6, 1);
  {
    // Prefilled a block per step, each written through before the next takes host memory's room.
    auto prefill = n.scheduler().open_sequence(keys);
    ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
    const StepItem chunk{prefill->id, setup.geometry.page_tokens};
    for (std::size_t b = 0; b < keys.size(); ++b) {
      auto r = n.run_step(std::span(&chunk, 1), kNanosPerMicro);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      n.settle();
    }
    ASSERT_TRUE(n.scheduler().close_sequence(prefill->id).ok());
    n.settle();
  }
  uint32_t in_hbm_not_host = 0;
  for (const BlockKey& k : keys) {
    auto info = n.table().lookup(k);
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->nvme, CopyState::kReady) << to_string(k);
    const bool all_hbm = std::all_of(info->pages.begin(), info->pages.end(),
                                     [](const PageInfo& p) { return p.hbm == CopyState::kReady; });
    const bool no_host = std::all_of(info->pages.begin(), info->pages.end(), [](const PageInfo& p) {
      return p.host == CopyState::kAbsent;
    });
    in_hbm_not_host += all_hbm && no_host;
  }
  ASSERT_GE(in_hbm_not_host, 4u) << "the setup should leave most blocks in HBM and on NVMe only";
  const uint64_t reads_before = n.port().counters(Link::kNvmeToHost).transfers;
  auto s = n.scheduler().open_sequence(keys);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->reused_blocks, keys.size());
  const StepItem item{s->id, 1};
  for (int step = 0; step < 3; ++step) {
    auto r = n.run_step(std::span(&item, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_EQ(r.stall, 0) << "step " << step << " waited for a load";
  }
  EXPECT_EQ(n.port().counters(Link::kNvmeToHost).transfers, reads_before);
  ASSERT_TRUE(n.scheduler().close_sequence(s->id).ok());
  n.settle();
  expect_consistent(n);
}

// Puts `keys` on NVMe only, as a restart's recovered index would (cached, no copy in memory).
void adopt_on_nvme(SimWorld& w, std::span<const BlockKey> keys) {
  for (const BlockKey& k : keys) {
    w.port().store_on_nvme(k);
    ASSERT_TRUE(w.scheduler().adopt_nvme_block(k).ok()) << to_string(k);
  }
}

// A slow NVMe link that carries one read at a time (a 16 KiB block reads in ~164 us), so reads
// queue on it; room for 16 blocks in HBM; loading chosen over recomputing unless a test says so.
SimSetup one_read_at_a_time(uint32_t host_frames) {
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = host_frames;
  setup.nvme_extents = 256;
  setup.nvme_read_gbps = 0.1;
  setup.max_inflight_bytes = 1;
  setup.policies.prefill_tokens_per_s = 100;
  return setup;
}

// True when every page of `key` has a ready copy in host memory.
bool ready_in_host(SimWorld& w, const BlockKey& key) {
  auto info = w.table().lookup(key);
  return info.ok() && std::ranges::all_of(info->pages, [](const PageInfo& p) {
           return p.host == CopyState::kReady;
         });
}

uint32_t count_ready_in_host(SimWorld& w, std::span<const BlockKey> keys) {
  return static_cast<uint32_t>(
      std::ranges::count_if(keys, [&](const BlockKey& k) { return ready_in_host(w, k); }));
}

// Runs the loop until every layer of `step` has finished (ready or failed); returns how long that
// took in virtual time.
Nanos time_to_all_layers(SimWorld& w, const StepInfo& step) {
  const Nanos start = w.loop().now();
  for (uint32_t l = 0; l < step.layers; ++l) {
    auto ready = w.scheduler().layer_readiness(step.id, l);
    EXPECT_TRUE(ready.ok());
    if (!ready.ok()) return -1;
    EXPECT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }))
        << "layer " << l << " never became ready";
    EXPECT_TRUE((*ready)->wait(0).ok()) << "layer " << l;
  }
  return w.loop().now() - start;
}

// The same when host memory has free frames: open_sequence's whole-block reads get their host
// frames at once (the host pages are filling) and wait on the NVMe link as prefetches, behind
// other prefetches. A step over the prefix must move them up: its layers are ready after its own
// reads (and the one in flight), not after the whole prefetch queue.
TEST(SchedulerSim, ADemandMovesItsNvmeBlockReadsWithFramesInHandAheadOfPrefetches) {
  SimSetup setup = one_read_at_a_time(256);  // every read gets its host frames at once
  SimWorld w(setup);
  const std::vector<BlockKey> other = w.prompt(8, 1);
  const std::vector<BlockKey> mine = w.prompt(2, 2);
  adopt_on_nvme(w, other);
  adopt_on_nvme(w, mine);
  auto a = w.scheduler().open_sequence(other);  // 8 block reads queued as prefetches
  auto b = w.scheduler().open_sequence(mine);   // 2 more behind them
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->reused_blocks, 8u);
  ASSERT_EQ(b->reused_blocks, 2u);
  const StepItem item{b->id, 1};
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_FALSE(step->windowed);
  const Nanos took = time_to_all_layers(w, *step);
  const Nanos block_read = LinkModel{setup.nvme_read_gbps * 1e9, 2 * kNanosPerMicro}.transfer_time(
      4 * setup.geometry.page_bytes());
  // Its 2 reads and the one in flight: 3 block reads (and the copies up); behind the whole
  // prefetch queue it would be 10.
  EXPECT_LT(took, 5 * block_read) << "the step waited " << took << " ns; a block reads in "
                                  << block_read << " ns";
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  for (auto id : {a->id, b->id}) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

// A sequence just opened reads its prefix from NVMe ahead of the reads hints queued for requests
// still waiting (kAdmitted), even where a hint queued its own blocks' reads first (they move up);
// and compute-or-load weighs only what the reads will wait behind: with the hinted reads counted,
// loading this prefix would look slower than recomputing it.
TEST(SchedulerSim, AnOpenedSequencesNvmeReadsGoAheadOfHintedReadsAndAreNotWeighedAgainstThem) {
  SimSetup setup = one_read_at_a_time(256);  // every read gets its host frames at once
  // A block recomputes in 400 us: two blocks save 2 x ~234 us when loaded, less than the hinted
  // reads queued ahead would cost (8 blocks, ~1.3 ms) but more than the one read in flight.
  setup.policies.prefill_tokens_per_s = 16 / 400e-6;
  SimWorld w(setup);
  const std::vector<BlockKey> waiting = w.prompt(8, 1);
  const std::vector<BlockKey> mine = w.prompt(2, 2);
  adopt_on_nvme(w, waiting);
  adopt_on_nvme(w, mine);
  // Both are hinted, `mine` last: ten block reads queued as prefetches, one in flight.
  const std::vector<HintedRequest> queue{{1, 0, waiting}, {2, 0, mine}};
  ASSERT_TRUE(w.scheduler().hint(queue).ok());

  auto opened = w.scheduler().open_sequence(mine);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_EQ(opened->reused_blocks, 2u) << "the hinted reads were weighed against the load";
  ASSERT_TRUE(w.loop().run_while_not([&] { return count_ready_in_host(w, mine) == mine.size(); }));
  EXPECT_LE(count_ready_in_host(w, waiting), 1u)
      << "only the read in flight when the sequence opened goes first";
  w.settle();
  EXPECT_EQ(count_ready_in_host(w, waiting), waiting.size()) << "the hinted reads still complete";
  ASSERT_TRUE(w.scheduler().close_sequence(opened->id).ok());
  w.settle();
  expect_consistent(w);
}

// The same when the hint's read of the sequence's block still waits for host frames as the
// sequence opens: once it has them, it is queued at kAdmitted, not at the hint's priority.
TEST(SchedulerSim, AHintedReadRaisedWhileWaitingForHostFramesIsQueuedForTheOpenedSequence) {
  SimSetup setup = one_read_at_a_time(8);  // two blocks of 4 layers
  SimWorld w(setup);
  const std::vector<BlockKey> waiting = w.prompt(3, 1);
  const std::vector<BlockKey> mine = w.prompt(1, 2);
  adopt_on_nvme(w, waiting);
  adopt_on_nvme(w, mine);
  // The first two blocks take every host frame (one read in flight, one queued); the third
  // block's and then `mine`'s frame requests wait.
  const std::vector<HintedRequest> queue{{1, 0, waiting}, {2, 0, mine}};
  ASSERT_TRUE(w.scheduler().hint(queue).ok());
  ASSERT_EQ(w.host().free_count(), 0u);
  auto opened = w.scheduler().open_sequence(mine);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ASSERT_EQ(opened->reused_blocks, 1u);
  const auto& queued = w.scheduler().stats().link_queued_bytes[static_cast<int>(Link::kNvmeToHost)];
  bool queued_as_admitted = false;
  ASSERT_TRUE(w.loop().run_while_not([&] {
    queued_as_admitted |= queued[static_cast<int>(TransferPriority::kAdmitted)].load() > 0;
    return ready_in_host(w, mine[0]);
  })) << "the sequence's block never reached host memory";
  EXPECT_TRUE(queued_as_admitted) << "its read waited among the hint's reads";
  ASSERT_TRUE(w.scheduler().close_sequence(opened->id).ok());
  w.settle();
  expect_consistent(w);
}

// The HBM half of the same: the prefix's host copies arrived while HBM was full, so its loads'
// HBM frame requests wait in the prefetch queue, behind another sequence's. A step over the
// prefix moves them to the demand queue: as frames come free (slow demotions), the step's pages
// get them before the other sequence's prefetches.
TEST(SchedulerSim, ADemandMovesItsQueuedHbmFrameRequestsAheadOfPrefetches) {
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = 256;
  setup.nvme_extents = 256;
  setup.nvme_read_gbps = 1.0;  // the prefixes reach host memory in microseconds
  setup.d2h_gbps = 0.004;      // ... but an HBM frame comes free every ~1 ms (a demotion)
  setup.policies.prefill_tokens_per_s = 100;  // loading is always chosen
  SimWorld w(setup);
  const std::vector<BlockKey> other = w.prompt(4, 1);
  const std::vector<BlockKey> mine = w.prompt(2, 2);
  adopt_on_nvme(w, other);
  adopt_on_nvme(w, mine);
  auto a = w.scheduler().open_sequence(other);  // HBM loads issued as prefetches
  auto b = w.scheduler().open_sequence(mine);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->reused_blocks, 4u);
  ASSERT_EQ(b->reused_blocks, 2u);
  // Another prompt takes every HBM frame before the reads land; cached, it leaves by demotion.
  ASSERT_TRUE(w.prefill_and_close(w.prompt(16, 3), kNanosPerMicro).ok());
  ASSERT_EQ(w.hbm().free_count(), 0u);
  ASSERT_TRUE(w.loop().run_while_not([&] { return count_ready_in_host(w, mine) == mine.size(); }));
  const StepItem item{b->id, 1};
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_FALSE(step->windowed);
  const Nanos took = time_to_all_layers(w, *step);
  const Nanos demotion = LinkModel{setup.d2h_gbps * 1e9, 2 * kNanosPerMicro}.transfer_time(
      setup.geometry.page_bytes());
  // 12 frames (8 loaded pages, 4 written); behind the other sequence's 16 it would be 28.
  EXPECT_LT(took, 18 * demotion) << "the step waited " << took << " ns; a frame comes free every "
                                 << demotion << " ns";
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  for (auto id : {a->id, b->id}) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

// Opens a sequence over `prompt` before it is computed (nothing to reuse), then has another
// sequence compute the prompt and close: the first sequence's step refills those blocks.
Result<OpenedSequence> open_before_computed(SimWorld& w, std::span<const BlockKey> prompt) {
  KVTIER_ASSIGN_OR_RETURN(OpenedSequence s, w.scheduler().open_sequence(prompt));
  if (s.reused_blocks != 0) return internal_error("the prompt was cached already");
  KVTIER_RETURN_IF_ERROR(w.prefill_and_close(prompt, kNanosPerMicro));
  return s;
}

// A block a sequence did not reuse (it opened before the block was computed) is refilled:
// the step writes its pages into the entry that is there. Copies of them in host memory that are
// the last outside HBM are dropped as the engine writes each page: the same content, now in HBM,
// and otherwise a host frame no plan could free while the block is in use.
TEST(SchedulerSim, ARefillDropsTheHostCopiesOfThePagesItWrites) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 64;
  SimWorld w(setup);
  // Later prompts push the refilled block down to host memory.
  const std::vector<BlockKey> prompt = w.prompt(1, 1);
  auto s = open_before_computed(w, prompt);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  for (uint32_t p = 2; p <= 5; ++p) {  // four more blocks fill HBM's 16 frames
    ASSERT_TRUE(w.prefill_and_close(w.prompt(1, p), kNanosPerMicro).ok());
  }
  w.settle();
  auto before = w.table().lookup(prompt[0]);
  ASSERT_TRUE(before.ok());
  for (const PageInfo& p : before->pages) {
    ASSERT_EQ(p.hbm, CopyState::kAbsent);
    ASSERT_EQ(p.host, CopyState::kReady) << "the first prompt should be in host memory only";
  }
  const uint64_t loads_before = w.port().counters(Link::kHostToHbm).transfers;
  const StepItem item{s->id, setup.geometry.page_tokens};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(w.port().counters(Link::kHostToHbm).transfers, loads_before) << "nothing to load";
  auto after = w.table().lookup(prompt[0]);
  ASSERT_TRUE(after.ok());
  for (std::size_t l = 0; l < after->pages.size(); ++l) {
    EXPECT_EQ(after->pages[l].hbm, CopyState::kReady) << "layer " << l << " was not written";
    EXPECT_EQ(after->pages[l].host, CopyState::kAbsent) << "layer " << l << ": host copy kept";
  }
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(prompt).blocks, 1u) << "the refilled block is cached again";
  expect_consistent(w);
}

// A refilled block's pages are not pinned until the step plans them: room made for the step's
// earlier pages may demote them. The step then writes such a page afresh once its demotion has
// landed, rather than loading it back (in memory full of pages that cannot leave, that load
// waited for an HBM frame only its own host copy's frame could free: random seed 5715).
TEST(SchedulerSim, ARefilledPageDemotedForTheStepsOwnRoomIsWrittenNotLoadedBack) {
  SimSetup setup;
  setup.hbm_frames = 8;  // two blocks
  setup.host_frames = 64;
  setup.policies.pin_quota = 0.5;  // one block
  SimWorld w(setup);
  // Another prompt fills HBM beside the refilled block.
  const std::vector<BlockKey> prompt = w.prompt(1, 1);
  auto s = open_before_computed(w, prompt);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const std::vector<BlockKey> pinned = w.prompt(1, 2);
  ASSERT_TRUE(w.prefill_and_close(pinned, kNanosPerMicro).ok());
  w.settle();
  ASSERT_EQ(w.hbm().free_count(), 0u);
  auto pin = w.scheduler().pin_prefix(pinned, 3600 * kNanosPerSecond);
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  // The step refills the first prompt's block and opens a block after it. The other block is
  // pinned in HBM: the frames the new block needs come from demoting the refilled block's pages
  // the step has not planned yet.
  const uint64_t loads_before = w.port().counters(Link::kHostToHbm).transfers;
  const uint64_t demoted_before = w.scheduler().stats().demotions[tier_index(Tier::kHost)].load();
  const StepItem item{s->id, 2 * setup.geometry.page_tokens};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_GT(w.scheduler().stats().demotions[tier_index(Tier::kHost)].load(), demoted_before);
  EXPECT_EQ(w.port().counters(Link::kHostToHbm).transfers, loads_before)
      << "the step loaded back pages it writes";
  expect_tables_valid(w, r);
  ASSERT_TRUE(w.scheduler().unpin_prefix(*pin).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(prompt).blocks, 1u) << "the refilled block is cached, whole";
  expect_consistent(w);
}

// prefetch.on_late = recompute: the first step gives up the late part of the reused prefix and
// the engine recomputes it; the step must not also wait for the load open_sequence started for
// those blocks (it writes them: recomputing AND stalling would be the worst of both).
TEST(SchedulerSim, ALatePrefixGivenUpForRecomputeIsNotWaitedFor) {
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = 256;
  setup.nvme_extents = 256;
  setup.nvme_read_gbps = 0.01;                // a block reads in ~1.6 ms: late for a 1 ms deadline
  setup.policies.prefill_tokens_per_s = 100;  // loading is chosen at open
  setup.policies.prefetch.on_late = LatePolicy::kRecompute;
  setup.policies.prefetch.deadline_ms = 1;
  SimWorld w(setup);
  const std::vector<BlockKey> prefix = w.prompt(2, 1);
  adopt_on_nvme(w, prefix);
  auto s = w.scheduler().open_sequence(prefix);  // starts reading the prefix (prefetches)
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 2u);
  const uint64_t recomputed_before = w.scheduler().stats().recompute_tokens.load();
  const StepItem item{s->id, 1};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.info.items[0].recomputed_tokens, 2u * 16);
  EXPECT_EQ(r.info.items[0].context_tokens, 0u);
  EXPECT_EQ(w.scheduler().stats().recompute_tokens.load() - recomputed_before, 2u * 16);
  expect_tables_valid(w, r);
  const Nanos block_read = LinkModel{setup.nvme_read_gbps * 1e9, 2 * kNanosPerMicro}.transfer_time(
      4 * setup.geometry.page_bytes());
  EXPECT_LT(r.stall, block_read / 10)
      << "the step waited " << r.stall << " ns for the load of what it recomputed";
  w.settle();
  // The recomputed blocks are cached (written into their entries), and the next step reads them.
  EXPECT_EQ(w.scheduler().match(prefix).blocks, 2u);
  const StepItem next{s->id, 1};
  auto r2 = w.run_step(std::span(&next, 1), kNanosPerMicro);
  ASSERT_TRUE(r2.status.ok()) << r2.status.to_string();
  EXPECT_EQ(r2.info.items[0].context_tokens, 2u * 16 + 1);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// A step refills a prefix it gave up as late (on_late = recompute) while HBM is full: its frame
// requests wait. A second sequence opens over the same prefix, which has reached host memory
// meanwhile, and its step loads it: those loads' frame requests queue behind the first step's.
// When the first step's requests are served, its engine writes the pages; the second step's
// loads then find them filling, and must wait for that write (and read it), not fail.
TEST(SchedulerSim, ALoadOvertakenByARefillWaitsForTheEnginesWriteInsteadOfFailing) {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 256;
  setup.nvme_extents = 256;
  setup.nvme_read_gbps = 0.01;                // a block reads in ~1.6 ms: late for a 1 ms deadline
  setup.d2h_gbps = 0.004;                     // an HBM frame comes free every ~1 ms (a demotion)
  setup.policies.prefill_tokens_per_s = 100;  // loading is always chosen at open
  setup.policies.prefetch.on_late = LatePolicy::kRecompute;
  setup.policies.prefetch.deadline_ms = 1;
  SimWorld w(setup);
  const std::vector<BlockKey> prefix = w.prompt(2, 1);
  adopt_on_nvme(w, prefix);
  // Every HBM frame holds a cached page with no copy below: each leaves by a slow demotion.
  ASSERT_TRUE(w.prefill_and_close(w.prompt(8, 2), kNanosPerMicro).ok());
  ASSERT_EQ(w.hbm().free_count(), 0u);
  auto a = w.scheduler().open_sequence(prefix);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->reused_blocks, 2u);
  const StepItem ia{a->id, 1};
  auto sa = w.scheduler().begin_step(std::span(&ia, 1));
  ASSERT_TRUE(sa.ok()) << sa.status().to_string();
  ASSERT_EQ(sa->items[0].recomputed_tokens, 2u * 16) << "the NVMe prefix is late: recomputed";
  // The prefix reaches host memory (open_sequence's reads) while the refill waits for frames.
  ASSERT_TRUE(w.loop().run_while_not([&] {
    for (const BlockKey& k : prefix) {
      auto info = w.table().lookup(k);
      if (!info.ok()) return false;
      for (const PageInfo& p : info->pages) {
        if (p.host != CopyState::kReady) return false;
      }
    }
    return true;
  }));
  auto b = w.scheduler().open_sequence(prefix);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->reused_blocks, 2u);
  const StepItem ib{b->id, 1};
  auto sb = w.scheduler().begin_step(std::span(&ib, 1));
  ASSERT_TRUE(sb.ok()) << sb.status().to_string();
  ASSERT_EQ(sb->items[0].recomputed_tokens, 0u) << "in host memory, the prefix is on time";
  for (uint32_t l = 0; l < sa->layers; ++l) {
    auto ready = w.scheduler().layer_readiness(sa->id, l);
    ASSERT_TRUE(ready.ok());
    ASSERT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }));
    ASSERT_TRUE((*ready)->wait(0).ok()) << "first step, layer " << l;
    ASSERT_TRUE(w.scheduler().end_layer(sa->id, l).ok());
  }
  ASSERT_TRUE(w.scheduler().end_step(sa->id, {}).ok());
  for (uint32_t l = 0; l < sb->layers; ++l) {
    auto ready = w.scheduler().layer_readiness(sb->id, l);
    ASSERT_TRUE(ready.ok());
    ASSERT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }))
        << "second step, layer " << l << ": " << w.scheduler().pending_summary();
    const Status s = (*ready)->wait(0);
    EXPECT_TRUE(s.ok()) << "second step, layer " << l << ": " << s.to_string();
  }
  const Status ended = w.scheduler().end_step(sb->id, {});
  EXPECT_TRUE(ended.ok()) << ended.to_string();
  for (auto id : {a->id, b->id}) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

TEST(SchedulerSim, PrefetchHidesTransfersWhenLinksAreTwiceTheDemand) {
  // Every decode step reads all 8 layers of a 48-block context that does not fit in HBM, so each
  // layer's 48 pages (48 x 2 KiB... page_bytes) come from host memory while earlier layers
  // compute. Link bandwidth is set to twice what the compute rate demands.
  SimSetup setup;
  setup.geometry.layers = 8;
  setup.hbm_frames = 200;  // < 8 x 49 pages: windowed
  setup.host_frames = 1024;
  setup.nvme_extents = 0;
  const Nanos compute_per_layer = 50 * kNanosPerMicro;
  const double page_bytes = static_cast<double>(setup.geometry.page_bytes());
  const double demand_bytes_per_s = 49 * page_bytes / nanos_to_seconds(compute_per_layer);
  setup.h2d_gbps = 2 * demand_bytes_per_s / 1e9;
  setup.d2h_gbps = 2 * demand_bytes_per_s / 1e9;
  setup.policies.prefetch.layer_window = 3;
  SimWorld w(setup);
  auto s = w.scheduler().open_sequence(w.prompt(48, 9));
  ASSERT_TRUE(s.ok());
  const StepItem prefill{s->id, 48 * 16};
  ASSERT_TRUE(w.run_step(std::span(&prefill, 1), compute_per_layer).status.ok());
  Nanos stall = 0;
  Nanos total = 0;
  for (int t = 0; t < 20; ++t) {
    const StepItem decode{s->id, 1};
    auto r = w.run_step(std::span(&decode, 1), compute_per_layer);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    ASSERT_TRUE(r.info.windowed);
    if (t == 0) continue;  // the first decode step starts with an empty pipeline
    stall += r.stall;
    total += r.stall + r.compute;
  }
  const double stall_fraction = static_cast<double>(stall) / static_cast<double>(total);
  EXPECT_LT(stall_fraction, 0.05) << "stall " << stall << " ns of " << total << " ns";
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// Prefetches are counted by their lead: one a step joins while it is still in flight is late, one
// that arrived first is on time, and a load a step joins at the instant it was issued (a sequence
// opened and stepped at once: open_sequence prefetches the reused prefix, begin_step demands it)
// had no lead to lose and is neither. Before, those last ones were all counted late, which made
// "prefetch on time" fall whenever more prompts started from host memory.
TEST(SchedulerSim, PrefetchesAreCountedByTheirLead) {
  SimSetup setup;
  setup.hbm_frames = 128;  // 32 blocks of 4 layers; hinted prefixes may fill 96 frames
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.75, 0.95};
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  // Five prompts computed while a sequence holds 24 private blocks in HBM (an open sequence's
  // blocks leave last): the first four go down to host memory. Then the sequence closes, and
  // hinted prefixes have room in HBM below its low watermark.
  auto held = w.hold_private_blocks(24, kNanosPerMicro);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(5, 4, 5 * kNanosPerMicro, prompts).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(*held).ok());
  w.settle();
  prompts.resize(3);
  for (const auto& keys : prompts) {
    const MatchResult m = w.scheduler().match(keys);
    ASSERT_EQ(m.blocks, 4u);
    ASSERT_EQ(m.by_tier[tier_index(Tier::kHost)], 4u) << "the prompt must start from host memory";
  }
  const SchedulerStats& st = w.scheduler().stats();
  const uint32_t pages = 4 * setup.geometry.layers;
  const auto serve = [&](const std::vector<BlockKey>& keys) {  // one decode step
    const Status s = w.step_and_close(keys, 1, 5 * kNanosPerMicro);
    ASSERT_TRUE(s.ok()) << s.to_string();
    w.settle();
  };

  // Opened and stepped at once: demand loads, neither prefetches nor late.
  uint64_t prefetches = st.prefetches.load();
  uint64_t late = st.late_prefetches.load();
  const uint64_t promoted = st.promotions[tier_index(Tier::kHbm)].load();
  serve(prompts[0]);
  EXPECT_EQ(st.promotions[tier_index(Tier::kHbm)].load() - promoted, pages);
  EXPECT_EQ(st.prefetches.load() - prefetches, 0u);
  EXPECT_EQ(st.late_prefetches.load() - late, 0u);

  // Hinted, then stepped 1 us later, before any load arrived (each takes the link's 2 us
  // latency): every one is a late prefetch.
  prefetches = st.prefetches.load();
  late = st.late_prefetches.load();
  const HintedRequest soon{1, 0, prompts[1]};
  ASSERT_TRUE(w.scheduler().hint(std::span(&soon, 1)).ok());
  w.loop().run_until(w.loop().now() + kNanosPerMicro);
  serve(prompts[1]);
  EXPECT_EQ(st.prefetches.load() - prefetches, pages);
  EXPECT_EQ(st.late_prefetches.load() - late, pages);

  // Hinted, and stepped once every load has arrived: on time.
  prefetches = st.prefetches.load();
  late = st.late_prefetches.load();
  const HintedRequest ahead{2, 0, prompts[2]};
  ASSERT_TRUE(w.scheduler().hint(std::span(&ahead, 1)).ok());
  w.settle();
  serve(prompts[2]);
  EXPECT_EQ(st.prefetches.load() - prefetches, pages);
  EXPECT_EQ(st.late_prefetches.load() - late, 0u);
  expect_consistent(w);
}

// A waiting request's prefix is prefetched into HBM only below its low watermark: the frames
// above it, which watermark demotions keep free, are for the sequences running. (Taking them, a
// hinted prefix was evicted by the next demotion and loaded again by the next hint, round after
// round.) The same prefix, once its sequence opens, is brought up into any free frame.
TEST(SchedulerSim, AWaitingRequestsPrefixIsPrefetchedIntoHbmOnlyBelowItsLowWatermark) {
  SimSetup setup;
  setup.hbm_frames = 64;  // 16 blocks of 4 layers; demotions keep 48 frames or fewer in use
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.75, 0.95};
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  const uint64_t low = 48;
  const uint32_t layers = setup.geometry.layers;
  // A sequence holds two private blocks in HBM while five prompts of four blocks are computed
  // (the first two end up in host memory only); then it closes, and its frames are free: HBM is
  // below its low watermark by as many.
  auto held = w.hold_private_blocks(2, kNanosPerMicro);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(5, 4, 5 * kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.hbm().used(), low);
  ASSERT_TRUE(w.scheduler().close_sequence(*held).ok());
  w.settle();
  const uint64_t below = w.hbm().used();
  ASSERT_EQ(below, low - 2 * layers);
  const std::vector<BlockKey>& waiting = prompts[0];
  ASSERT_EQ(w.scheduler().match(waiting).by_tier[tier_index(Tier::kHost)], 4u);

  // Hinted: prefetched into HBM up to the low watermark, not into the frames above it, and
  // nothing evicted for it.
  const auto& evictions = w.scheduler().stats().evictions[tier_index(Tier::kHbm)];
  const uint64_t evicted = evictions.load();
  const HintedRequest request{1, 0, waiting};
  ASSERT_TRUE(w.scheduler().hint(std::span(&request, 1)).ok());
  w.settle();
  EXPECT_GT(w.hbm().used(), below) << "the room below the watermark was used";
  EXPECT_LE(w.hbm().used(), low);
  EXPECT_LT(w.scheduler().match(waiting).by_tier[tier_index(Tier::kHbm)], 4u);
  EXPECT_EQ(evictions.load(), evicted);

  // Opened: the rest comes up into the free frames above it, before any step asks.
  auto opened = w.scheduler().open_sequence(waiting);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  w.settle();
  EXPECT_EQ(w.scheduler().match(waiting).by_tier[tier_index(Tier::kHbm)], 4u);
  EXPECT_GT(w.hbm().used(), low);
  ASSERT_TRUE(w.scheduler().close_sequence(opened->id).ok());
  w.settle();
  expect_consistent(w);
}

TEST(SchedulerSim, ComputeOrLoadRecomputesWhatIsSlowerToLoad) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  setup.nvme_read_gbps = 1e-6;  // a pathological disk: 1 KB/s
  setup.policies.prefill_tokens_per_s = 1e4;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  const MatchResult m = w.scheduler().match(prompts[0]);
  ASSERT_EQ(m.blocks, 4u);
  ASSERT_EQ(m.by_tier[tier_index(Tier::kNvme)], 4u) << "the first prompt should be on nvme only";
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->matched_blocks, 4u);
  EXPECT_EQ(s->reused_blocks, 0u) << "loading from this disk is slower than recomputing";
  EXPECT_EQ(s->recompute_blocks, 4u);
  EXPECT_EQ(w.scheduler().stats().recompute_blocks.load(), 4u);

  // The recomputed blocks are written into their existing entries (refilled), not into private
  // blocks: keyed, with the NVMe copy kept, their pages may leave memory like any cached block's.
  const uint64_t published = w.scheduler().stats().blocks_published.load();
  const StepItem item{s->id, 4 * 16};
  auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(w.scheduler().stats().blocks_refilled.load(), 4u);
  EXPECT_EQ(w.scheduler().stats().blocks_published.load(), published) << "refills are not new";
  for (const auto& [key, info] : w.table().snapshot()) {
    EXPECT_FALSE(key.is_private()) << to_string(key);
  }
  for (const BlockKey& k : prompts[0]) {
    auto info = w.table().lookup(k);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->refcount, 1u);
    EXPECT_EQ(info->nvme, CopyState::kReady);
    for (const PageInfo& p : info->pages) EXPECT_EQ(p.hbm, CopyState::kReady);
  }
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(prompts[0]).blocks, 4u);
  expect_consistent(w);
}

// on_late = recompute gives up a late reused prefix at the sequence's first begin_step. When that
// begin_step then fails (one layer of the batch cannot fit), or the step is aborted, the tokens
// given up must still be reported as recomputed by the next step, or the engine would write its
// new tokens at the wrong position.
TEST(SchedulerSim, ARecomputedPrefixIsReportedAgainAfterAFailedOrAbortedStep) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  setup.policies.prefill_tokens_per_s = 10.0;  // slow prefill: loading the prefix is chosen
  setup.policies.prefetch.on_late = LatePolicy::kRecompute;
  setup.policies.prefetch.deadline_ms = 0;  // ... and every load is late
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kNvme)], 4u);
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->reused_blocks, 4u);
  const uint64_t prefix_tokens = 4 * 16;

  const StepItem too_big{s->id, 64 * 16};  // one layer needs more frames than HBM has
  EXPECT_EQ(w.scheduler().begin_step(std::span(&too_big, 1)).status().code(),
            StatusCode::kResourceExhausted);
  const StepItem one{s->id, 1};
  auto step = w.scheduler().begin_step(std::span(&one, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_EQ(step->items[0].context_tokens + step->items[0].recomputed_tokens, prefix_tokens);
  EXPECT_GT(step->items[0].recomputed_tokens, 0u);
  ASSERT_TRUE(w.scheduler().abort_step(step->id).ok());
  w.settle();

  auto r = w.run_step(std::span(&one, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.info.items[0].context_tokens + r.info.items[0].recomputed_tokens, prefix_tokens);
  // Once a step has recomputed them, nothing is owed any more.
  auto next = w.run_step(std::span(&one, 1), kNanosPerMicro);
  ASSERT_TRUE(next.status.ok()) << next.status.to_string();
  EXPECT_EQ(next.info.items[0].recomputed_tokens, 0u);
  EXPECT_EQ(next.info.items[0].context_tokens, prefix_tokens + 1);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

}  // namespace
}  // namespace kvtier
