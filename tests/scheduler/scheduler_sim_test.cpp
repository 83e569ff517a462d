// The scheduler against modeled tiers in virtual time: the step contract. Prefill publishes and a
// second request reuses; blocks evicted down the tiers come back intact and in the format of the
// tier below HBM; a context four times larger than HBM decodes layer by layer; admission against
// open steps' reservations and pinned prefixes; write-through. Deterministic: no wall time, no
// threads (scheduler_sim_harness.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
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

// Sequences of one batch that share a prompt read its blocks through one frame per layer: the
// batch is charged for the shared blocks once, in begin_step and in what its open step holds
// against the next one (frames_held). Three sequences over a 4-block system prompt, a block of
// their own each: 7 frames a layer, all 4 layers in 32 frames, where 15 a layer would be windowed.
TEST(SchedulerSim, ABatchThatSharesAPromptIsChargedForItOnce) {
  SimSetup setup;
  setup.hbm_frames = 32;
  SimWorld w(setup);
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const std::vector<BlockKey> system = w.prompt(4, 1, /*shared_prefix=*/4);
  ASSERT_TRUE(w.prefill_and_close(system, kNanosPerMicro).ok());
  const auto open_batch = [&](uint32_t sequences, uint32_t salt) {
    std::vector<StepItem> items;
    for (uint32_t i = 0; i < sequences; ++i) {
      auto s = w.scheduler().open_sequence(w.prompt(5, salt + i, /*shared_prefix=*/4));
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (!s.ok()) return items;
      EXPECT_EQ(s->reused_blocks, 4u);
      items.push_back(StepItem{s->id, page_tokens});
    }
    return items;
  };
  const auto close_batch = [&](const std::vector<StepItem>& items) {
    for (const StepItem& item : items) {
      ASSERT_TRUE(w.scheduler().close_sequence(item.sequence).ok());
    }
    w.settle();  // the system prompt's pages moved by a windowed step are matched once settled
  };

  const std::vector<StepItem> three = open_batch(3, 10);
  ASSERT_EQ(three.size(), 3u);
  auto r = w.run_step(three, kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.info.windowed) << "4 shared + 3 own blocks x 4 layers fit in 32 frames";
  EXPECT_EQ(r.invalid_frames, 0u);
  close_batch(three);

  // Five sequences: 9 frames a layer, 36 for all layers: windowed.
  const std::vector<StepItem> five = open_batch(5, 20);
  ASSERT_EQ(five.size(), 5u);
  r = w.run_step(five, kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.info.windowed) << "4 shared + 5 own blocks x 4 layers exceed 32 frames";
  EXPECT_EQ(r.invalid_frames, 0u);
  close_batch(five);

  // While the three-sequence step is open it holds 28 frames: a one-block step fits beside it.
  const std::vector<StepItem> again = open_batch(3, 30);
  auto open = w.scheduler().begin_step(again);
  ASSERT_TRUE(open.ok()) << open.status().to_string();
  auto alone = w.scheduler().open_sequence({});
  ASSERT_TRUE(alone.ok());
  const StepItem one{alone->id, page_tokens};
  auto beside = w.scheduler().begin_step(std::span(&one, 1));
  ASSERT_TRUE(beside.ok()) << beside.status().to_string();
  EXPECT_FALSE(beside->windowed) << "4 frames are left beside the open step's 28";
  for (const StepInfo* step : {&*open, &*beside}) {
    ASSERT_TRUE(w.scheduler().abort_step(step->id).ok());
  }
  close_batch(again);
  ASSERT_TRUE(w.scheduler().close_sequence(alone->id).ok());
  w.settle();
  expect_consistent(w);
}

// A decode step whose context is resident pins it in every layer when it begins (one block pin
// per block, not a pin per page), lists those frames in each layer's table, holds it to its end
// even as its layers end, and gives every pin back however it ends: end_step alone, end_layer
// layer by layer, or abort_step.
TEST(SchedulerSim, AStepHoldsItsResidentContextWholeUntilItEndsAndEveryWayOfEndingUnpinsIt) {
  SimSetup setup;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const std::vector<BlockKey> context = w.prompt(3, 1);
  ASSERT_TRUE(w.prefill_and_close(context, kNanosPerMicro).ok());
  w.settle();
  auto seq = w.scheduler().open_sequence(context);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  ASSERT_EQ(seq->reused_blocks, 3u);
  const auto pins = [&](const BlockKey& key, uint32_t layer) {
    auto info = w.table().lookup(key);
    EXPECT_TRUE(info.ok());
    return info.ok() ? info->pages[layer].pins : 99u;
  };
  const auto block_pins = [&](const BlockKey& key) {
    auto info = w.table().lookup(key);
    return info.ok() ? info->block_pins : 99u;
  };
  const auto expect_context_pins = [&](std::initializer_list<uint32_t> per_layer,
                                       const char* when) {
    for (const BlockKey& key : context) {
      uint32_t l = 0;
      for (uint32_t want : per_layer) {
        EXPECT_EQ(pins(key, l), want) << when << ", layer " << l;
        ++l;
      }
    }
  };
  enum class Ending { kEndStep, kEndLayers, kAbort };
  for (Ending ending : {Ending::kEndStep, Ending::kEndLayers, Ending::kAbort}) {
    SCOPED_TRACE(static_cast<int>(ending));
    const StepItem decode{seq->id, 1};
    auto step = w.scheduler().begin_step(std::span(&decode, 1));
    ASSERT_TRUE(step.ok()) << step.status().to_string();
    ASSERT_FALSE(step->windowed);
    expect_context_pins({1, 1, 1, 1}, "while the step is open");
    for (const BlockKey& key : context) EXPECT_EQ(block_pins(key), 1u) << "one pin per block";
    for (uint32_t l = 0; l < layers; ++l) {
      auto ready = w.scheduler().layer_readiness(step->id, l);
      ASSERT_TRUE(ready.ok());
      ASSERT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }));
      auto table = w.scheduler().layer_table(step->id, l);
      ASSERT_TRUE(table.ok()) << table.status().to_string();
      for (std::size_t b = 0; b < context.size(); ++b) {
        auto info = w.table().lookup(context[b]);
        ASSERT_TRUE(info.ok());
        EXPECT_EQ(table->indices[b], static_cast<int32_t>(info->pages[l].hbm_frame))
            << "block " << b << " layer " << l;
      }
    }
    switch (ending) {
      case Ending::kEndStep: break;
      case Ending::kEndLayers:
        ASSERT_TRUE(w.scheduler().end_layer(step->id, 0).ok());
        ASSERT_TRUE(w.scheduler().end_layer(step->id, 2).ok());
        expect_context_pins({1, 1, 1, 1}, "after end_layer(0) and (2): held to the step's end");
        break;
      case Ending::kAbort:
        ASSERT_TRUE(w.scheduler().abort_step(step->id).ok());
        expect_context_pins({0, 0, 0, 0}, "after abort_step");
        continue;
    }
    ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
    expect_context_pins({0, 0, 0, 0}, "after end_step");
    for (const BlockKey& key : context) EXPECT_EQ(block_pins(key), 0u);
  }
  ASSERT_TRUE(w.scheduler().close_sequence(seq->id).ok());
  w.settle();
  expect_consistent(w);
}

// The same when room must be planned while the step begins (HBM full of cached blocks, and the
// decoded token opens a block): the plan sees only the pins page-by-page order had reached, and
// the pins taken ahead are given back and taken again page by page, each page pinned once.
TEST(SchedulerSim, RoomPlannedWhileAStepBeginsLeavesEachPagePinnedOnce) {
  SimSetup setup;  // 64 HBM frames: 16 blocks of 4 layers
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> fillers;
  ASSERT_TRUE(w.compute_prompts(13, 1, kNanosPerMicro, fillers).ok());
  const std::vector<BlockKey> context = w.prompt(3, 100);
  ASSERT_TRUE(w.prefill_and_close(context, kNanosPerMicro).ok());
  w.settle();
  ASSERT_EQ(w.hbm().free_count(), 0u) << "the step's new page must make room";
  auto seq = w.scheduler().open_sequence(context);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  ASSERT_EQ(seq->reused_blocks, 3u);
  const uint64_t plans_before = w.scheduler().placement_counters().plans;
  const StepItem decode{seq->id, 1};
  auto step = w.scheduler().begin_step(std::span(&decode, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_FALSE(step->windowed);
  EXPECT_GT(w.scheduler().placement_counters().plans, plans_before);
  for (const BlockKey& key : context) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok());
    for (uint32_t l = 0; l < setup.geometry.layers; ++l) {
      EXPECT_EQ(info->pages[l].pins, 1u) << "layer " << l;
    }
  }
  for (uint32_t l = 0; l < setup.geometry.layers; ++l) {
    auto ready = w.scheduler().layer_readiness(step->id, l);
    ASSERT_TRUE(ready.ok());
    ASSERT_TRUE(w.loop().run_while_not([&] { return (*ready)->finished(); }));
  }
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  for (const BlockKey& key : context) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok());
    for (const PageInfo& p : info->pages) EXPECT_EQ(p.pins, 0u);
  }
  ASSERT_TRUE(w.scheduler().close_sequence(seq->id).ok());
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
  setup.d2h_gbps = 0.01;  // a page takes milliseconds to reach host memory
  setup.policies.write = WritePolicy::kWriteThrough;
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.0, 0.2};  // above 3 frames: demote all
  SimWorld w(setup);
  const std::vector<BlockKey> keys = w.prompt(1, 1);
  auto seq = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(seq.ok());
  const StepItem item{seq->id, setup.geometry.page_tokens};
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  // The engine ends every layer before the loop runs: the watermark check they asked for then
  // finds every page of the block written and unpinned, and demotes them all while the engine
  // samples, before the step ends and its write-through starts.
  for (uint32_t l = 0; l < step->layers; ++l) {
    ASSERT_TRUE(w.scheduler().end_layer(step->id, l).ok());
  }
  w.loop().run_until(w.loop().now());
  auto demoting = w.table().lookup(keys[0]);
  ASSERT_TRUE(demoting.ok());
  for (const PageInfo& p : demoting->pages) {
    ASSERT_EQ(p.hbm, CopyState::kDraining) << "the watermark should be demoting the block";
  }
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(seq->id).ok());
  w.settle();
  auto info = w.table().lookup(keys[0]);
  ASSERT_TRUE(info.ok());
  for (std::size_t l = 0; l < info->pages.size(); ++l) {
    EXPECT_EQ(info->pages[l].host, CopyState::kReady) << "layer " << l << " has no host copy";
  }
  EXPECT_EQ(info->nvme, CopyState::kReady) << "the block was written through to NVMe";
  expect_consistent(w);
}

// A page a watermark demoted as its layer ended is still on its way to host memory when the step
// ends: host memory holds one page of the block, filling. The write-through still copies the
// other pages down and writes the block to NVMe (host memory counts as holding the block only
// when it holds every page).
TEST(SchedulerSim, WriteThroughCopiesTheOtherPagesOfABlockPartlyOnItsWayDown) {
  SimSetup setup;
  setup.hbm_frames = 16;
  setup.d2h_gbps = 0.01;  // a page takes milliseconds to reach host memory
  setup.policies.write = WritePolicy::kWriteThrough;
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.0, 0.2};  // above 3 frames: demote all
  SimWorld w(setup);
  const std::vector<BlockKey> keys = w.prompt(1, 1);
  ASSERT_TRUE(w.prefill_and_close(keys, kNanosPerMicro).ok());
  auto demoting = w.table().lookup(keys[0]);
  ASSERT_TRUE(demoting.ok());
  ASSERT_EQ(demoting->pages[0].hbm, CopyState::kDraining)
      << "the watermark should be demoting the first layer's page";
  w.settle();
  auto info = w.table().lookup(keys[0]);
  ASSERT_TRUE(info.ok());
  for (std::size_t l = 0; l < info->pages.size(); ++l) {
    EXPECT_EQ(info->pages[l].host, CopyState::kReady) << "layer " << l << " has no host copy";
  }
  EXPECT_EQ(info->nvme, CopyState::kReady) << "the block was written through to NVMe";
  expect_consistent(w);
}

// end_layer only asks for a watermark check: the plan runs on the loop after the call, and its
// moves a slice per loop task, so an engine call waits behind one slice at most.
TEST(SchedulerSim, AWatermarkCheckRunsOnTheLoopASliceOfBlocksAtATime) {
  SimSetup setup;
  setup.hbm_frames = 128;                                           // 32 one-block prompts
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.0, 0.9};  // above 115 frames: all
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> cached;
  ASSERT_TRUE(w.compute_prompts(28, 1, kNanosPerMicro, cached).ok());  // 112 frames: below
  const auto blocks_draining = [&w] {
    std::set<BlockKey> draining;
    for (const auto& [key, info] : w.table().snapshot()) {
      for (const PageInfo& p : info.pages) {
        if (p.hbm == CopyState::kDraining) draining.insert(key);
      }
    }
    return draining;
  };
  // A two-block prefill takes HBM to 120 frames; its first layer's end crosses the watermark.
  auto seq = w.scheduler().open_sequence(w.prompt(2, 99));
  ASSERT_TRUE(seq.ok());
  const StepItem item{seq->id, 2 * setup.geometry.page_tokens};
  auto step = w.scheduler().begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_TRUE(w.scheduler().end_layer(step->id, 0).ok());
  EXPECT_TRUE(blocks_draining().empty()) << "end_layer carried the watermark's plan out itself";
  std::set<BlockKey> seen;
  std::size_t most_in_one_task = 0;
  w.loop().after_each_event([&] {
    std::size_t started = 0;
    for (const BlockKey& key : blocks_draining()) started += seen.insert(key).second ? 1 : 0;
    most_in_one_task = std::max(most_in_one_task, started);
  });
  w.settle();
  w.loop().after_each_event({});
  EXPECT_GT(seen.size(), 8u) << "the plan should have demoted most cached blocks";
  EXPECT_LE(most_in_one_task, 8u) << "one loop task started demoting more than a slice of blocks";
  for (uint32_t l = 1; l < step->layers; ++l)
    ASSERT_TRUE(w.scheduler().end_layer(step->id, l).ok());
  ASSERT_TRUE(w.scheduler().end_step(step->id, {}).ok());
  ASSERT_TRUE(w.scheduler().close_sequence(seq->id).ok());
  w.settle();
  expect_consistent(w);
}

// A watermark plan demotes many pages at once: they reach the HBM->host link in batches (one
// copy per batch, CopyBatcher), not one copy per page, and every page still lands in host memory.
TEST(SchedulerSim, AWatermarkPlansDemotionsReachTheLinkInBatches) {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 64;
  setup.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.0, 0.7};  // above 22 frames: demote all
  SimWorld w(setup);
  std::vector<std::vector<BlockKey>> prompts;
  for (uint32_t p = 0; p < 6; ++p) {
    prompts.push_back(w.prompt(1, p + 1));
    ASSERT_TRUE(w.prefill_and_close(prompts.back(), kNanosPerMicro).ok());
  }
  w.settle();
  const uint64_t demoted = w.scheduler().stats().demotions[tier_index(Tier::kHost)].load();
  const uint64_t copies = w.port().transfer_stats().link(Link::kHbmToHost).ops.load();
  EXPECT_GE(demoted, 2u * setup.geometry.layers) << "the watermark should have demoted blocks";
  EXPECT_LT(copies, demoted) << "each page was copied on its own";
  for (const auto& keys : prompts) {
    auto info = w.table().lookup(keys[0]);
    ASSERT_TRUE(info.ok());
    for (const PageInfo& p : info->pages) {
      EXPECT_TRUE(p.hbm == CopyState::kReady || p.host == CopyState::kReady)
          << to_string(keys[0]) << " lost a page";
    }
  }
  expect_consistent(w);
}

// Write-through copies every page of a completed block down as its step ends: a prefill's blocks
// reach the HBM->host link in batches too (a copy per batch, not per page), each block's host
// copy complete, and each block then on NVMe.
TEST(SchedulerSim, WriteThroughCopiesReachTheLinkInBatches) {
  SimSetup setup;
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const std::vector<BlockKey> keys = w.prompt(6, 1);
  ASSERT_TRUE(w.prefill_and_close(keys, kNanosPerMicro).ok());
  w.settle();
  const uint64_t pages = keys.size() * setup.geometry.layers;
  const uint64_t copies = w.port().transfer_stats().link(Link::kHbmToHost).ops.load();
  EXPECT_EQ(w.scheduler().stats().demotions[tier_index(Tier::kHost)].load(), pages);
  EXPECT_LT(copies, pages / 2) << "the write-through copied " << pages << " pages in " << copies;
  for (const BlockKey& key : keys) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok());
    for (const PageInfo& p : info->pages) {
      EXPECT_EQ(p.hbm, CopyState::kReady) << to_string(key) << ": write-through keeps HBM's copy";
      EXPECT_EQ(p.host, CopyState::kReady) << to_string(key) << " was not copied to host memory";
    }
    EXPECT_EQ(info->nvme, CopyState::kReady) << to_string(key) << " was not written to NVMe";
  }
  expect_consistent(w);
}

}  // namespace
}  // namespace kvtier
