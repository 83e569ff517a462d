// The scheduler against modeled tiers in virtual time: the step contract, reuse, eviction down the
// tiers and back, contexts larger than HBM, overlap of loads with compute, compute-or-load,
// failures and misuse. Deterministic: no wall time, no threads.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::SimSetup;
using testing::SimWorld;

void expect_consistent(SimWorld& w) {
  Status audit = w.table().audit();
  EXPECT_TRUE(audit.ok()) << audit.to_string();
  EXPECT_EQ(w.hbm().used() + w.hbm().free_count(), w.hbm().capacity());
  EXPECT_EQ(w.host().used() + w.host().free_count(), w.host().capacity());
}

// Every page listed for a layer was a distinct, allocated HBM frame when the engine read it, and
// the tables have one row per batch item.
void expect_tables_valid(SimWorld& w, const SimWorld::StepResult& r) {
  EXPECT_EQ(r.invalid_frames, 0u) << "a block table listed a frame that was not resident";
  for (const LayerTable& t : r.tables) ASSERT_EQ(t.indptr.size(), r.info.items.size() + 1);
}

TEST(SchedulerSim, PrefillPublishesAndASecondRequestReusesTheBlocks) {
  SimWorld w(SimSetup{});
  auto keys = w.prompt(8, 1);
  auto a = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->matched_blocks, 0u);
  const StepItem prefill{a->id, 8 * 16};
  auto r = w.run_step(std::span(&prefill, 1), 10 * kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  expect_tables_valid(w, r);
  EXPECT_EQ(w.scheduler().stats().blocks_published.load(), 8u);
  ASSERT_TRUE(w.scheduler().close_sequence(a->id).ok());
  w.settle();

  auto b = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->matched_blocks, 8u);
  EXPECT_EQ(b->reused_blocks, 8u);
  EXPECT_EQ(b->reused_by_tier[tier_index(Tier::kHbm)], 8u);
  const StepItem decode{b->id, 1};
  auto r2 = w.run_step(std::span(&decode, 1), 10 * kNanosPerMicro);
  ASSERT_TRUE(r2.status.ok()) << r2.status.to_string();
  ASSERT_EQ(r2.tables.size(), 4u);
  EXPECT_EQ(r2.tables[0].indices.size(), 9u);  // 8 reused pages + 1 new
  EXPECT_EQ(r2.tables[0].last_page_len[0], 1);
  ASSERT_TRUE(w.scheduler().close_sequence(b->id).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_EQ(w.table().snapshot().size(), 8u) << "the private block must be gone after close";
}

TEST(SchedulerSim, BlocksEvictedDownTheTiersComeBackIntact) {
  SimSetup setup;
  setup.hbm_frames = 32;   // 8 blocks of 4 layers
  setup.host_frames = 64;  // 16 blocks
  setup.nvme_extents = 128;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  for (uint32_t p = 0; p < 12; ++p) {
    prompts.push_back(w.prompt(4, p + 1));
    auto s = w.scheduler().open_sequence(prompts.back());
    ASSERT_TRUE(s.ok());
    const StepItem item{s->id, 4 * 16};
    auto r = w.run_step(std::span(&item, 1), 5 * kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "prompt " << p << ": " << r.status.to_string();
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
    w.settle();
    expect_consistent(w);
  }
  // 48 blocks were computed; HBM holds 8, host 16: the oldest went to NVMe.
  EXPECT_GT(w.port().nvme_blocks(), 0u);
  EXPECT_GT(w.scheduler().stats().demotions[tier_index(Tier::kNvme)].load(), 0u);
  // The first prompt is found again, somewhere below HBM, and a step brings it back.
  const MatchResult m = w.scheduler().match(prompts[0]);
  EXPECT_EQ(m.blocks, 4u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kHbm)], 0u);
  auto s = w.scheduler().open_sequence(prompts[0]);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reused_blocks, 4u);
  const StepItem decode{s->id, 1};
  auto r = w.run_step(std::span(&decode, 1), 5 * kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  expect_tables_valid(w, r);
  EXPECT_GT(w.scheduler().stats().promotions[tier_index(Tier::kHbm)].load(), 0u);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// Under write_back, the NVMe copies left below a promoted prefix are the first to go when NVMe
// needs room (its pages are all in memory, so nothing is lost), ahead of the older blocks only
// NVMe holds; the prefix stays matched, from memory.
TEST(SchedulerSim, CopiesLeftBelowAPromotedPrefixGoFirst) {
  SimSetup setup;
  // 12 blocks of 4 layers: the open prefix (4 blocks and a partial one) and each new prompt fit
  // together, so the prefix stays in HBM (a block its open sequence reads goes last).
  setup.hbm_frames = 48;
  setup.host_frames = 32;   // 8 blocks
  setup.nvme_extents = 12;  // full once the new prompts push blocks down
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;  // prompt(4, 1), prompt(4, 2), ...
  ASSERT_TRUE(w.compute_prompts(6, 4, 5 * kNanosPerMicro, prompts).ok());
  const std::vector<BlockKey> first = prompts[0];
  ASSERT_EQ(w.scheduler().match(first).by_tier[tier_index(Tier::kNvme)], 4u);
  // Promote the first prompt and keep its sequence open, then fill NVMe with new blocks.
  auto s = w.scheduler().open_sequence(first);
  ASSERT_TRUE(s.ok());
  const StepItem decode{s->id, 1};
  auto r = w.run_step(std::span(&decode, 1), 5 * kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  w.settle();
  const uint64_t before = w.scheduler().placement_counters().shadowed_drops;
  for (uint32_t p = 7; p <= 8; ++p) {
    ASSERT_TRUE(w.prefill_and_close(w.prompt(4, p), 5 * kNanosPerMicro).ok());
    w.settle();
  }
  EXPECT_GT(w.scheduler().placement_counters().shadowed_drops, before);
  EXPECT_GT(w.scheduler().stats().shadowed_evictions[tier_index(Tier::kNvme)].load(), 0u);
  EXPECT_EQ(w.scheduler().stats().shadowed_evictions[tier_index(Tier::kHbm)].load(), 0u);
  auto info = w.table().lookup(first[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->nvme, CopyState::kAbsent) << "its NVMe copy went first";
  const MatchResult m = w.scheduler().match(first);
  EXPECT_EQ(m.blocks, 4u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kNvme)], 0u) << "served from memory";
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// The same workload with the tiers below HBM in fp8 (tiers.host.kv_dtype, tiers.nvme.kv_dtype):
// the scheduler makes the same moves, and each link carries the pages in the format of the tier
// it reaches or leaves, so its bytes shrink by exactly the page formats' ratio.
TEST(SchedulerSim, LinksMovePagesInTheFormatOfTheTierBelowHbm) {
  const auto run = [](TierKvDtype host, TierKvDtype nvme) {
    SimSetup setup;
    setup.hbm_frames = 32;
    setup.host_frames = 64;
    setup.nvme_extents = 128;
    setup.host_kv_dtype = host;
    setup.nvme_kv_dtype = nvme;
    auto w = std::make_unique<SimWorld>(setup);
    for (uint32_t p = 0; p < 12; ++p) {
      auto s = w->scheduler().open_sequence(w->prompt(4, p + 1));
      EXPECT_TRUE(s.ok());
      const StepItem item{s->id, 4 * 16};
      EXPECT_TRUE(w->run_step(std::span(&item, 1), 5 * kNanosPerMicro).status.ok());
      EXPECT_TRUE(w->scheduler().close_sequence(s->id).ok());
      w->settle();
    }
    auto s = w->scheduler().open_sequence(w->prompt(4, 1));  // back up from NVMe
    EXPECT_TRUE(s.ok());
    const StepItem decode{s->id, 1};
    EXPECT_TRUE(w->run_step(std::span(&decode, 1), 5 * kNanosPerMicro).status.ok());
    EXPECT_TRUE(w->scheduler().close_sequence(s->id).ok());
    w->settle();
    expect_consistent(*w);
    return w;
  };
  const auto model = run(TierKvDtype::kModel, TierKvDtype::kModel);
  const auto nvme = run(TierKvDtype::kModel, TierKvDtype::kFp8E4M3);
  const auto both = run(TierKvDtype::kFp8E4M3, TierKvDtype::kFp8E4M3);
  const Geometry& g = model->setup().geometry;
  const uint64_t wide = g.page_bytes();
  const uint64_t fp8 = PageFormat::fp8(g).page_bytes();
  for (Link link : {Link::kHbmToHost, Link::kHostToHbm, Link::kHostToNvme, Link::kNvmeToHost}) {
    const bool nvme_link = link == Link::kHostToNvme || link == Link::kNvmeToHost;
    const SimLinkCounters& m = model->port().counters(link);
    ASSERT_GT(m.transfers, 0u) << link_name(link);
    for (SimWorld* w : {nvme.get(), both.get()}) {
      const SimLinkCounters& c = w->port().counters(link);
      const bool narrow = nvme_link || w == both.get();
      EXPECT_EQ(c.transfers, m.transfers) << link_name(link);
      EXPECT_EQ(c.bytes * wide, m.bytes * (narrow ? fp8 : wide)) << link_name(link);
    }
  }
}

TEST(SchedulerSim, ContextFourTimesLargerThanHbmDecodesLayerByLayer) {
  SimSetup setup;
  setup.geometry.layers = 8;
  setup.hbm_frames = 64;  // one sequence of 32 blocks needs 256 frames: 4x HBM
  setup.host_frames = 512;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  auto keys = w.prompt(32, 3);
  auto s = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(s.ok());
  // Prefill in chunks of 8 blocks, then decode 40 tokens.
  for (int c = 0; c < 4; ++c) {
    const StepItem chunk{s->id, 8 * 16};
    auto r = w.run_step(std::span(&chunk, 1), 20 * kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "chunk " << c << ": " << r.status.to_string();
    expect_tables_valid(w, r);
  }
  for (int t = 0; t < 40; ++t) {
    const StepItem decode{s->id, 1};
    auto r = w.run_step(std::span(&decode, 1), 20 * kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "decode " << t << ": " << r.status.to_string();
    EXPECT_TRUE(r.info.windowed);
    ASSERT_EQ(r.tables.size(), 8u);
    EXPECT_EQ(r.tables[0].indices.size(), (512u + t + 1 + 15) / 16);
    expect_tables_valid(w, r);
  }
  EXPECT_GT(w.scheduler().stats().windowed_steps.load(), 0u);
  EXPECT_LE(w.hbm().capacity(), 64u);
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
  // Every prompt block was published (some only after their last transfers ended, past the close)
  // and stays cached.
  EXPECT_EQ(w.scheduler().match(keys).blocks, 32u);
}

// Two open steps whose pages load from below: neither has pinned its frames yet when the second
// begins (a step pins a frame as it is granted), so counting pins alone would admit both whole
// and each could end up holding part of HBM, waiting for the rest. The second is admitted
// against what the first has reserved: it goes layer by layer, and both complete.
TEST(SchedulerSim, ASecondStepIsAdmittedAgainstTheFirstStepsReservation) {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 64;
  setup.nvme_extents = 256;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 5, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kHbm)], 0u);
  ASSERT_EQ(w.scheduler().match(prompts[1]).by_tier[tier_index(Tier::kHbm)], 0u);
  auto a = w.scheduler().open_sequence(prompts[0]);
  auto b = w.scheduler().open_sequence(prompts[1]);
  ASSERT_TRUE(a.ok() && b.ok());
  const StepItem ia{a->id, 1}, ib{b->id, 1};
  auto sa = w.scheduler().begin_step(std::span(&ia, 1));
  ASSERT_TRUE(sa.ok()) << sa.status().to_string();
  EXPECT_FALSE(sa->windowed) << "6 pages x 4 layers fit in 32 frames";
  auto sb = w.scheduler().begin_step(std::span(&ib, 1));
  ASSERT_TRUE(sb.ok()) << sb.status().to_string();
  EXPECT_TRUE(sb->windowed) << "24 frames reserved by the first step leave 8: one layer at a time";
  for (const StepInfo* step : {&*sa, &*sb}) {
    for (uint32_t l = 0; l < step->layers; ++l) {
      auto ready = w.scheduler().layer_readiness(step->id, l);
      ASSERT_TRUE(ready.ok());
      ASSERT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }))
          << "step " << step->id << " layer " << l << " never became ready";
      ASSERT_TRUE((*ready)->wait(0).ok());
      ASSERT_TRUE(w.scheduler().end_layer(step->id, l).ok());
    }
    ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  }
  for (auto id : {a->id, b->id}) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
}

// The frames of a pinned prefix are never HBM victims, so begin_step admits a batch against what
// they leave: a layer that cannot fit beside them fails at once, naming them, instead of waiting
// for frames that never come; a batch that fits beside them only layer by layer is windowed; and
// a batch that reads the pinned blocks itself is not charged for them twice.
TEST(SchedulerSim, BeginStepCountsTheFramesOfPinnedPrefixes) {
  SimSetup setup;
  setup.hbm_frames = 32;  // 4 layers; pin_quota 0.25: 8 frames, two blocks
  SimWorld w(setup);
  const std::vector<BlockKey> system = w.prompt(2, 1, /*shared_prefix=*/2);
  ASSERT_TRUE(w.prefill_and_close(system, kNanosPerMicro).ok());
  auto pin = w.scheduler().pin_prefix(system, 3600 * kNanosPerSecond);
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  // (Not settle(): that would run the pin's TTL out.)
  ASSERT_EQ(w.scheduler().match(system).by_tier[tier_index(Tier::kHbm)], 2u);

  // 25 pages per layer; 24 frames are not pinned.
  auto big = w.scheduler().open_sequence(w.prompt(25, 2));
  ASSERT_TRUE(big.ok());
  const StepItem whole{big->id, 25 * 16};
  auto refused = w.scheduler().begin_step(std::span(&whole, 1));
  ASSERT_FALSE(refused.ok()) << "one layer of 25 pages cannot fit beside 8 pinned frames";
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("only 24 of 32"), std::string::npos)
      << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("pinned prefixes: 2 blocks"), std::string::npos)
      << refused.status().to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(big->id).ok());

  // 7 pages per layer: 28 frames fit in HBM, but not beside the prefix.
  auto other = w.scheduler().open_sequence(w.prompt(7, 3));
  ASSERT_TRUE(other.ok());
  const StepItem seven{other->id, 7 * 16};
  auto r = w.run_step(std::span(&seven, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.info.windowed) << "7 pages x 4 layers do not fit in the 24 unpinned frames";
  EXPECT_EQ(r.invalid_frames, 0u);
  ASSERT_TRUE(w.scheduler().close_sequence(other->id).ok());

  // The pinned blocks plus 5 new ones: 7 pages per layer, of which only 5 need a frame.
  auto reader = w.scheduler().open_sequence(w.prompt(7, 4, /*shared_prefix=*/2));
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(reader->matched_blocks, 2u);
  const StepItem five{reader->id, 5 * 16};
  r = w.run_step(std::span(&five, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.info.windowed) << "5 new pages x 4 layers fit in the 24 unpinned frames";
  EXPECT_EQ(r.invalid_frames, 0u);
  ASSERT_TRUE(w.scheduler().close_sequence(reader->id).ok());

  EXPECT_EQ(w.scheduler().pinned_prefix_blocks(), 2u) << "the pin outlived every step";
  // The gauges other threads read show the same, without asking the loop.
  EXPECT_EQ(w.scheduler().stats().pinned_prefix_blocks.load(), 2u);
  EXPECT_EQ(w.scheduler().stats().open_sequences.load(), 0u);
  ASSERT_TRUE(w.scheduler().unpin_prefix(*pin).ok());
  EXPECT_EQ(w.scheduler().stats().pinned_prefix_blocks.load(), 0u);
  w.settle();
  expect_consistent(w);
}

// The converse: a prefix is not pinned into frames an open step was admitted against.
TEST(SchedulerSim, PinPrefixDoesNotTakeTheFramesOfOpenSteps) {
  SimSetup setup;
  setup.hbm_frames = 32;  // 4 layers; pin_quota 0.25: 8 frames, two blocks
  SimWorld w(setup);
  const std::vector<BlockKey> system = w.prompt(2, 1);
  ASSERT_TRUE(w.prefill_and_close(system, kNanosPerMicro).ok());
  auto s = w.scheduler().open_sequence(w.prompt(7, 2));
  ASSERT_TRUE(s.ok());
  const StepItem seven{s->id, 7 * 16};
  auto step = w.scheduler().begin_step(std::span(&seven, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_FALSE(step->windowed) << "7 pages x 4 layers fit in 32 frames";
  // The step's frames push the prefix down to host memory; still cached there.
  ASSERT_TRUE(w.loop().run_while_not([&] { return w.scheduler().match(system).blocks == 2; }));
  auto refused = w.scheduler().pin_prefix(system, 3600 * kNanosPerSecond);
  ASSERT_FALSE(refused.ok()) << "28 frames promised to the step leave no room for 8 pinned";
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("36 HBM frames of 32"), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(w.scheduler().pinned_prefix_blocks(), 0u);
  EXPECT_EQ(w.scheduler().stats().pinned_prefix_blocks.load(), 0u) << "the tried pins never show";
  EXPECT_EQ(w.scheduler().stats().open_sequences.load(), 1u);
  ASSERT_TRUE(w.scheduler().abort_step(step->id).ok());
  auto pinned = w.scheduler().pin_prefix(system, 3600 * kNanosPerSecond);
  ASSERT_TRUE(pinned.ok()) << pinned.status().to_string();
  ASSERT_TRUE(w.scheduler().unpin_prefix(*pinned).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  w.settle();
  expect_consistent(w);
}

// Write-through copies a completed block's HBM pages down at write-back priority, behind every
// load. Waiting there for host frames, a page is not pinned, so its frame stays a victim like any
// other (pinned, only the write-back itself could free it).
TEST(SchedulerSim, WriteThroughDoesNotPinPagesWhileTheyWaitForHostFrames) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 8;         // two blocks
  setup.nvme_write_gbps = 1e-6;  // 1 KB/s: the host copies stay busy being written down
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> blocks;
  for (uint32_t b = 0; b < 3; ++b) {
    blocks.push_back(w.prompt(1, b + 1));
    ASSERT_TRUE(w.prefill_and_close(blocks.back(), kNanosPerMicro).ok());
  }
  ASSERT_EQ(w.host().free_count(), 0u);
  auto third = w.table().lookup(blocks[2][0]);
  ASSERT_TRUE(third.ok());
  for (const PageInfo& p : third->pages) {
    ASSERT_EQ(p.hbm, CopyState::kReady);
    ASSERT_EQ(p.host, CopyState::kAbsent) << "the third block's write-through should be waiting";
    EXPECT_EQ(p.pins, 0u) << "a page waiting for a host frame is not pinned";
  }
  w.settle();
  for (const auto& keys : blocks) {
    auto info = w.table().lookup(keys[0]);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->nvme, CopyState::kReady) << to_string(keys[0]) << " was written through";
  }
  expect_consistent(w);
}

// A block's pages may be on their way down when its write-through starts (demoted by HBM's
// watermark as its step ran) or get there while they wait for host frames (unpinned, a demotion
// may take them). The write-through waits for those copies to land before it writes the block to
// NVMe, instead of finding host copies still filling and giving the NVMe copy up.
TEST(SchedulerSim, WriteThroughReachesNvmeWhenItsPagesAreDemotedMeanwhile) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 8;         // two blocks
  setup.nvme_write_gbps = 1e-6;  // the host copies stay busy being written down
  setup.policies.write = WritePolicy::kWriteThrough;
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.0, 0.5};  // above 8 frames: demote all
  setup.watermarks[tier_index(Tier::kHost)] = Watermarks{1.0, 1.0};
  SimWorld w(setup);
  for (uint32_t b = 0; b < 2; ++b) {
    ASSERT_TRUE(w.prefill_and_close(w.prompt(1, b + 1), kNanosPerMicro).ok());
  }
  // The third block's pages go over HBM's watermark: demoted as its layers end, still copying
  // when the step ends and its write-through starts.
  const std::vector<BlockKey> third = w.prompt(1, 3);
  ASSERT_TRUE(w.prefill_and_close(third, kNanosPerMicro).ok());
  auto demoting = w.table().lookup(third[0]);
  ASSERT_TRUE(demoting.ok());
  for (const PageInfo& p : demoting->pages) {
    ASSERT_EQ(p.hbm, CopyState::kDraining) << "the watermark should be demoting the third block";
  }
  w.settle();
  auto info = w.table().lookup(third[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->nvme, CopyState::kReady) << "the third block was written through to NVMe";
  expect_consistent(w);
}

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

// Puts `keys` on NVMe only, as a restart's recovered index would (cached, no copy in memory).
void adopt_on_nvme(SimWorld& w, std::span<const BlockKey> keys) {
  for (const BlockKey& k : keys) {
    w.port().store_on_nvme(k);
    ASSERT_TRUE(w.scheduler().adopt_nvme_block(k).ok()) << to_string(k);
  }
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
  SimSetup setup;
  setup.hbm_frames = 64;
  setup.host_frames = 256;  // every read gets its frames at once
  setup.nvme_extents = 256;
  setup.nvme_read_gbps = 0.1;                 // a block (16 KiB) reads in ~164 us
  setup.max_inflight_bytes = 1;               // one job in flight per link
  setup.policies.prefill_tokens_per_s = 100;  // loading is always chosen
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
  ASSERT_TRUE(w.loop().run_while_not([&] {
    for (const BlockKey& k : mine) {
      auto info = w.table().lookup(k);
      if (!info.ok()) return false;
      for (const PageInfo& p : info->pages) {
        if (p.host != CopyState::kReady) return false;
      }
    }
    return true;
  }));
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

TEST(SchedulerSim, OneLayerThatCannotFitIsAClearError) {
  SimSetup setup;
  setup.hbm_frames = 8;
  SimWorld w(setup);
  auto s = w.scheduler().open_sequence(w.prompt(16, 1));
  ASSERT_TRUE(s.ok());
  const StepItem item{s->id, 16 * 16};
  auto r = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("needs 16 HBM frames"), std::string::npos)
      << r.status().message();
  ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
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
  setup.hbm_frames = 64;  // 16 blocks of 4 layers, kept half free by its watermarks, so
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.5, 0.6};  // prefetches fit in HBM
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  SimWorld w(setup);
  // Three prompts computed, then two more that push them down to host memory.
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(5, 4, 5 * kNanosPerMicro, prompts).ok());
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

// hint() replaces the waiting queue: a request hinted again with other keys or another expected
// start is seen with its new ones (the lookahead evictor keeps what the queue will read, and,
// among hinted blocks, lets go first those whose reader starts last).
// The lookahead policy over an HBM of 8 blocks (of 4 layers) and a roomy host tier, no NVMe.
SimSetup lookahead_over_a_small_hbm() {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  setup.policies.eviction = EvictionPolicy::kLookahead;
  return setup;
}

TEST(SchedulerSim, AHintedRequestHintedAgainIsSeenWithItsNewKeysAndStart) {
  for (const bool change_keys : {true, false}) {
    SCOPED_TRACE(change_keys ? "new keys" : "new expected start");
    SimWorld w(lookahead_over_a_small_hbm());
    const std::vector<BlockKey> x = w.prompt(4, 1);  // the older prompt
    const std::vector<BlockKey> y = w.prompt(4, 2);
    ASSERT_TRUE(w.prefill_and_close(x, kNanosPerMicro).ok());
    ASSERT_TRUE(w.prefill_and_close(y, kNanosPerMicro).ok());
    w.settle();
    ASSERT_EQ(w.hbm().free_count(), 0u);
    if (change_keys) {
      // Request 1 will read y; then, hinted again, x instead (y is read by no one).
      const HintedRequest first{1, 100, y};
      ASSERT_TRUE(w.scheduler().hint(std::span(&first, 1)).ok());
      const HintedRequest again{1, 100, x};
      ASSERT_TRUE(w.scheduler().hint(std::span(&again, 1)).ok());
    } else {
      // Both are read; x's reader starts last, until y's is hinted again to start after it.
      const HintedRequest first[2] = {{1, 100, x}, {2, 50, y}};
      ASSERT_TRUE(w.scheduler().hint(first).ok());
      const HintedRequest again[2] = {{1, 100, x}, {2, 200, y}};
      ASSERT_TRUE(w.scheduler().hint(again).ok());
    }
    // A third prompt needs half of HBM: x is kept, y goes.
    ASSERT_TRUE(w.prefill_and_close(w.prompt(4, 3), kNanosPerMicro).ok());
    w.settle();
    EXPECT_EQ(w.scheduler().match(x).by_tier[tier_index(Tier::kHbm)], 4u);
    EXPECT_EQ(w.scheduler().match(y).by_tier[tier_index(Tier::kHbm)], 0u);
    expect_consistent(w);
  }
}

// With HBM full of an open sequence's prompt (`decoding`, 4 blocks) and a closed one (`closed`), a
// third prompt needs half of HBM: the closed prompt goes down to host memory, the open sequence's
// stays, and its next step finds its pages in HBM (nothing is promoted for it). Closes it.
void expect_the_open_sequence_stays_in_hbm(SimWorld& w, SequenceId open,
                                           const std::vector<BlockKey>& decoding,
                                           const std::vector<BlockKey>& closed) {
  ASSERT_EQ(w.hbm().free_count(), 0u);
  ASSERT_TRUE(w.prefill_and_close(w.prompt(4, 3), kNanosPerMicro).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(decoding).by_tier[tier_index(Tier::kHbm)], 4u);
  EXPECT_EQ(w.scheduler().match(closed).by_tier[tier_index(Tier::kHbm)], 0u);
  EXPECT_EQ(w.scheduler().match(closed).blocks, 4u);  // in host memory
  const uint64_t promoted = w.scheduler().stats().promotions[tier_index(Tier::kHbm)].load();
  const StepItem decode{open, 1};
  const auto step = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  ASSERT_TRUE(step.status.ok()) << step.status.to_string();
  EXPECT_EQ(w.scheduler().stats().promotions[tier_index(Tier::kHbm)].load(), promoted);
  ASSERT_TRUE(w.scheduler().close_sequence(open).ok());
  expect_consistent(w);
}

// The blocks an open sequence holds are read by its next step (every step reads all of its KV):
// the lookahead policy keeps them in HBM over a closed prompt's, whatever their classes say (a
// prompt reused many times ranks above one computed once). Without it, on the Mooncake trace at
// its recorded rate, decoding sequences lost their KV to HBM between steps and loaded it back:
// 0.84 requests/s, against 2.38 with it (kvtier-bench run, virtual clock).
TEST(SchedulerSim, LookaheadKeepsTheBlocksOfAnOpenSequenceInHbm) {
  SimWorld w(lookahead_over_a_small_hbm());
  const std::vector<BlockKey> reused = w.prompt(4, 1);
  ASSERT_TRUE(w.prefill_and_close(reused, kNanosPerMicro).ok());
  for (int i = 0; i < 6; ++i) {  // matched again and again: a prefix that comes back
    auto s = w.scheduler().open_sequence(reused);
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->reused_blocks, 4u);
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  }
  const std::vector<BlockKey> decoding = w.prompt(4, 2);
  auto open = w.scheduler().open_sequence(decoding);
  ASSERT_TRUE(open.ok());
  const StepItem prefill{open->id, 4 * 16};
  ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
  w.settle();
  expect_the_open_sequence_stays_in_hbm(w, open->id, decoding, reused);
}

// Whatever the policy, a block an open sequence holds leaves HBM only once nothing else can
// (Placement): here a closed prompt used after the open sequence's goes down instead, though LRU,
// LFU (a tie, the older first), S3-FIFO (first in, first out) and prefix_aware rank the open
// sequence's blocks first. Without the rule, LRU on the Mooncake trace at its recorded rate loaded
// such blocks back for their sequence's next step (28.3 TB host->HBM, 13.7 TB with it: 1.78 ->
// 2.26 requests/s in kvtier-bench run, virtual clock).
TEST(SchedulerSim, EveryPolicyKeepsTheBlocksAnOpenSequenceReadsInHbm) {
  for (const EvictionPolicy policy :
       {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
        EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    SimSetup setup = lookahead_over_a_small_hbm();  // HBM: two prompts of 4 blocks x 4 layers
    setup.policies.eviction = policy;
    SimWorld w(setup);
    SCOPED_TRACE(std::string(eviction_policy_name(policy)));
    const std::vector<BlockKey> decoding = w.prompt(4, 1);
    auto open = w.scheduler().open_sequence(decoding);
    ASSERT_TRUE(open.ok());
    const StepItem prefill{open->id, 4 * 16};
    ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
    const std::vector<BlockKey> closed = w.prompt(4, 2);  // computed after, and closed
    ASSERT_TRUE(w.prefill_and_close(closed, kNanosPerMicro).ok());
    w.settle();
    expect_the_open_sequence_stays_in_hbm(w, open->id, decoding, closed);
  }
}

// Prefills `keys`, decodes `answer` tokens one step each, and closes the sequence, telling the
// scheduler the request generated `answer` tokens when `tell` says so.
void answer_and_close(SimWorld& w, const std::vector<BlockKey>& keys, uint32_t answer,
                      bool tell = true) {
  auto s = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const uint32_t prompt_tokens =
      static_cast<uint32_t>(keys.size()) * w.setup().geometry.page_tokens;
  const StepItem prefill{s->id, prompt_tokens - static_cast<uint32_t>(s->reused_tokens)};
  ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
  for (uint32_t t = 0; t < answer; ++t) {
    const StepItem decode{s->id, 1};
    ASSERT_TRUE(w.run_step(std::span(&decode, 1), kNanosPerMicro).status.ok());
  }
  ASSERT_TRUE(w.scheduler()
                  .close_sequence(s->id, tell ? std::optional<uint64_t>(answer) : std::nullopt)
                  .ok());
  w.settle();
}

// The engine tells close_sequence how much the request generated: lookahead learns that here the
// prompts answered in a few tokens come back (asked again at once) and those answered at length do
// not, and then keeps a prompt answered shortly over a newer one answered at length. Untold, or
// when both answers are short, both rank as first uses, and the older goes first.
TEST(SchedulerSim, LookaheadLearnsWhichPromptsComeBackFromHowMuchTheirRequestsGenerated) {
  for (const auto& [newer_answer, tell] : {std::pair{64u, true}, {2u, true}, {64u, false}}) {
    SCOPED_TRACE("newer prompt answered in " + std::to_string(newer_answer) + " tokens, " +
                 (tell ? "told" : "untold"));
    SimWorld w(lookahead_over_a_small_hbm());  // HBM: 8 blocks
    uint32_t salt = 1;
    for (int round = 0; round < 12; ++round) {
      const std::vector<BlockKey> asked_again = w.prompt(2, salt++);
      answer_and_close(w, asked_again, 2, tell);
      auto again = w.scheduler().open_sequence(asked_again);
      ASSERT_TRUE(again.ok());
      ASSERT_EQ(again->matched_blocks, 2u);
      ASSERT_TRUE(w.scheduler().close_sequence(again->id).ok());
      answer_and_close(w, w.prompt(2, salt++), 64, tell);  // never asked again
    }
    const std::vector<BlockKey> older = w.prompt(2, salt++);
    answer_and_close(w, older, 2, tell);
    const std::vector<BlockKey> newer = w.prompt(2, salt++);
    answer_and_close(w, newer, newer_answer, tell);
    // A prompt of 6 blocks leaves HBM room for one of the two.
    answer_and_close(w, w.prompt(6, salt++), 0, tell);
    const bool keeps_older = tell && newer_answer >= 64;
    EXPECT_EQ(w.scheduler().match(older).by_tier[tier_index(Tier::kHbm)], keeps_older ? 2u : 0u);
    EXPECT_EQ(w.scheduler().match(newer).by_tier[tier_index(Tier::kHbm)], keeps_older ? 0u : 2u);
    EXPECT_EQ(w.scheduler().match(older).blocks, 2u);  // the other one is in host memory
    EXPECT_EQ(w.scheduler().match(newer).blocks, 2u);
    expect_consistent(w);
  }
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

TEST(SchedulerSim, AFailedLoadFailsTheLayerAndTheBlockIsNeverServed) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.host_frames = 16;
  setup.nvme_extents = 64;
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts(8, 4, kNanosPerMicro, prompts).ok());
  ASSERT_EQ(w.scheduler().match(prompts[0]).by_tier[tier_index(Tier::kNvme)], 4u);
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

// A block some sequence references must keep every page somewhere (or have it on its way).
std::string lost_page(SimWorld& w) {
  for (const auto& [key, info] : w.table().snapshot()) {
    if (info.refcount == 0) continue;
    if (info.nvme == CopyState::kReady || info.nvme == CopyState::kFilling) continue;
    for (std::size_t l = 0; l < info.pages.size(); ++l) {
      const PageInfo& p = info.pages[l];
      if (p.hbm == CopyState::kAbsent && p.host == CopyState::kAbsent) {
        return to_string(key) + " layer " + std::to_string(l);
      }
    }
  }
  return "";
}

class SchedulerRandomWorkload : public ::testing::TestWithParam<int> {};

TEST_P(SchedulerRandomWorkload, NeverBreaksAnInvariant) {
  std::mt19937 rng(static_cast<uint32_t>(GetParam()));
  SimSetup setup;
  setup.hbm_frames = 48;
  setup.host_frames = 96;
  setup.nvme_extents = 64;
  const EvictionPolicy policies[] = {EvictionPolicy::kLru, EvictionPolicy::kLfu,
                                     EvictionPolicy::kS3Fifo, EvictionPolicy::kPrefixAware,
                                     EvictionPolicy::kLookahead};
  setup.policies.eviction = policies[GetParam() % 5];
  const WritePolicy writes[] = {WritePolicy::kWriteBack, WritePolicy::kWriteThrough,
                                WritePolicy::kWriteThroughSelective};
  setup.policies.write = writes[GetParam() % 3];
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  for (uint32_t p = 0; p < 10; ++p) prompts.push_back(w.prompt(1 + rng() % 6, p, rng() % 3));
  std::vector<SequenceId> open;
  for (int op = 0; op < 300; ++op) {
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 3 || open.empty()) {
      auto s = w.scheduler().open_sequence(prompts[rng() % prompts.size()]);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      open.push_back(s->id);
    } else if (choice < 8) {
      const SequenceId id = open[rng() % open.size()];
      const StepItem item{id, 1 + static_cast<uint32_t>(rng() % 40)};
      auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
      // A step may not fit (resource_exhausted) but must never break the table.
      if (!r.status.ok()) {
        EXPECT_TRUE(r.status.code() == StatusCode::kResourceExhausted ||
                    r.status.code() == StatusCode::kDeadlineExceeded)
            << r.status.to_string();
      }
    } else {
      const std::size_t i = rng() % open.size();
      ASSERT_TRUE(w.scheduler().close_sequence(open[i]).ok());
      open.erase(open.begin() + static_cast<long>(i));
    }
    w.settle();
    Status audit = w.table().audit();
    ASSERT_TRUE(audit.ok()) << "op " << op << ": " << audit.to_string();
    const std::string lost = lost_page(w);
    ASSERT_EQ(lost, "") << "op " << op << " (choice " << choice
                        << "): a referenced block lost a page";
  }
  for (SequenceId id : open) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerRandomWorkload, ::testing::Range(0, 40));

}  // namespace
}  // namespace kvtier
