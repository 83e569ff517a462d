// The scheduler in virtual time: what a waiting request's hint loads ahead of it, and whether the
// request used it. A hint's loads (its prefix read from NVMe into host memory, pages loaded into
// HBM) are counted once per block and tier as they arrive, as reused when the request opens over
// them, and not at all when a sequence asks for the block before they arrive; a hinted copy
// evicted before its request comes takes its mark with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <span>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {

void PrintTo(const HintedCopies& c, std::ostream* os) {
  *os << "{hbm " << c.hbm << ", host " << c.host << "}";
}

namespace {

using testing::expect_consistent;
using testing::SimSetup;
using testing::SimWorld;

constexpr int kHbm = tier_index(Tier::kHbm);
constexpr int kHost = tier_index(Tier::kHost);
constexpr int kNvme = tier_index(Tier::kNvme);

// Room for 16 blocks of 4 layers in HBM and in host memory, and an NVMe tier below: of twelve
// prompts of four blocks computed one after another, the first are on NVMe only. HBM has two
// blocks' worth of frames free below its low watermark (a sequence held them while the prompts
// were computed).
struct HintWorld {
  SimSetup setup = [] {
    SimSetup s;
    s.hbm_frames = 64;
    s.watermarks[tier_index(Tier::kHbm)] = Watermarks{0.75, 0.95};
    s.host_frames = 64;
    s.nvme_extents = 256;
    return s;
  }();
  SimWorld w{setup};
  const uint64_t low = 48;  // HBM's low watermark, in frames
  std::vector<std::vector<BlockKey>> prompts;

  void compute() {
    auto held = w.hold_private_blocks(2, kNanosPerMicro);
    ASSERT_TRUE(held.ok()) << held.status().to_string();
    ASSERT_TRUE(w.compute_prompts(12, 4, 5 * kNanosPerMicro, prompts).ok());
    ASSERT_TRUE(w.scheduler().close_sequence(*held).ok());
    w.settle();
    for (int p = 0; p < 2; ++p) {
      ASSERT_EQ(w.scheduler().match(prompts[p]).by_tier[kNvme], 4u)
          << "prompt " << p << " should be on nvme only";
    }
  }
  Status hint(uint64_t request, const std::vector<BlockKey>& keys) {
    const HintedRequest r{request, 0, keys};
    return w.scheduler().hint(std::span(&r, 1));
  }
  uint64_t loads(int tier) { return w.scheduler().stats().hinted_loads[tier].load(); }
  uint64_t reused(int tier) { return w.scheduler().stats().hinted_loads_reused[tier].load(); }
  // Lets the loads the sequence started arrive, closes it, and lets what that starts settle.
  void close_settled(SequenceId sequence) {
    w.settle();
    ASSERT_TRUE(w.scheduler().close_sequence(sequence).ok());
    w.settle();
  }
  HintedCopies marks(const BlockKey& key) {
    auto info = w.table().lookup(key);
    return info.ok() ? info->hinted : HintedCopies{};
  }
};

// The first hint reads the prefix up from NVMe and loads none of it into HBM: a page read from
// NVMe takes its HBM frame when the read arrives, past the watermark check made when the load
// was issued. The next hint loads what fits below the watermark.
TEST(SchedulerSim, HintedLoadsAreCountedOnArrivalAndAsReusedWhenTheirRequestOpens) {
  HintWorld h;
  h.compute();
  const uint64_t below = h.w.hbm().used();
  ASSERT_EQ(below, h.low - 2 * h.setup.geometry.layers);
  const std::vector<BlockKey>& waiting = h.prompts[0];
  ASSERT_TRUE(h.hint(1, waiting).ok());
  h.w.settle();
  EXPECT_EQ(h.loads(kHost), 4u);
  EXPECT_EQ(h.loads(kHbm), 0u);
  EXPECT_EQ(h.w.hbm().used(), below);
  for (const BlockKey& k : waiting) {
    EXPECT_EQ(h.marks(k), (HintedCopies{.hbm = false, .host = true}));
  }

  ASSERT_TRUE(h.hint(1, waiting).ok());
  h.w.settle();
  EXPECT_GT(h.w.hbm().used(), below);
  EXPECT_LE(h.w.hbm().used(), h.low);
  uint32_t in_hbm = 0;
  for (const BlockKey& k : waiting) {
    const auto info = h.w.table().lookup(k);
    ASSERT_TRUE(info.ok());
    const bool any_hbm = std::ranges::any_of(
        info->pages, [](const PageInfo& p) { return p.hbm != CopyState::kAbsent; });
    EXPECT_EQ(h.marks(k).hbm, any_hbm);
    EXPECT_TRUE(h.marks(k).host);
    in_hbm += any_hbm;
  }
  EXPECT_EQ(h.loads(kHbm), in_hbm);
  EXPECT_EQ(h.loads(kHost), 4u) << "read once";
  EXPECT_EQ(h.loads(kNvme), 0u);
  // Hinted again with no room left below the watermark: nothing more is loaded or counted.
  ASSERT_TRUE(h.hint(1, waiting).ok());
  h.w.settle();
  EXPECT_EQ(h.loads(kHost), 4u);
  EXPECT_EQ(h.loads(kHbm), in_hbm);

  auto opened = h.w.scheduler().open_sequence(waiting);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_EQ(opened->reused_blocks, 4u);
  EXPECT_EQ(h.reused(kHost), 4u);
  EXPECT_EQ(h.reused(kHbm), in_hbm);
  for (const BlockKey& k : waiting) EXPECT_EQ(h.marks(k), HintedCopies{}) << "taken by reuse";
  ASSERT_NO_FATAL_FAILURE(h.close_settled(opened->id));
  // Loaded again for another request later, the blocks are not the hint's.
  EXPECT_EQ(h.loads(kHost), 4u);
  expect_consistent(h.w);
}

TEST(SchedulerSim, AHintedCopyEvictedBeforeItsRequestOpensIsNotCountedAsReused) {
  HintWorld h;
  h.compute();
  const std::vector<BlockKey>& waiting = h.prompts[0];
  ASSERT_TRUE(h.hint(1, waiting).ok());
  h.w.settle();
  ASSERT_EQ(h.loads(kHost), 4u);
  // The request is dropped from the queue; five new prompts take host memory and HBM.
  ASSERT_TRUE(h.w.scheduler().hint({}).ok());
  std::vector<std::vector<BlockKey>> later;
  for (uint32_t p = 0; p < 5; ++p) {
    later.push_back(h.w.prompt(4, 100 + p));
    ASSERT_TRUE(h.w.prefill_and_close(later.back(), 5 * kNanosPerMicro).ok());
    h.w.settle();
  }
  ASSERT_EQ(h.w.scheduler().match(waiting).by_tier[kNvme], 4u) << "evicted to NVMe only";
  for (const BlockKey& k : waiting) EXPECT_EQ(h.marks(k), HintedCopies{}) << "gone with its copies";

  // The request comes after all: it reuses the blocks from NVMe, none of them the hint's.
  auto opened = h.w.scheduler().open_sequence(waiting);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_EQ(opened->reused_blocks, 4u);
  EXPECT_EQ(h.reused(kHost), 0u);
  EXPECT_EQ(h.reused(kHbm), 0u);
  ASSERT_NO_FATAL_FAILURE(h.close_settled(opened->id));
  EXPECT_EQ(h.loads(kHost), 4u) << "the request's own loads are not the hint's";
  expect_consistent(h.w);
}

// A sequence opened while the hint's reads are in flight asks for them: they arrive as its loads,
// neither counted as the hint's nor as reused.
TEST(SchedulerSim, AHintsLoadsInFlightWhenTheirSequenceOpensAreTheSequences) {
  HintWorld h;
  h.compute();
  const std::vector<BlockKey>& waiting = h.prompts[1];
  ASSERT_TRUE(h.hint(1, waiting).ok());
  auto opened = h.w.scheduler().open_sequence(waiting);  // before any read has arrived
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ASSERT_EQ(opened->reused_blocks, 4u);
  h.w.settle();
  const MatchResult m = h.w.scheduler().match(waiting);
  EXPECT_EQ(m.by_tier[kHost] + m.by_tier[kHbm], 4u) << "the reads arrived";
  EXPECT_EQ(h.loads(kHost), 0u);
  EXPECT_EQ(h.loads(kHbm), 0u);
  EXPECT_EQ(h.reused(kHost), 0u);
  for (const BlockKey& k : waiting) EXPECT_EQ(h.marks(k), HintedCopies{});
  ASSERT_NO_FATAL_FAILURE(h.close_settled(opened->id));
  expect_consistent(h.w);
}

}  // namespace
}  // namespace kvtier
