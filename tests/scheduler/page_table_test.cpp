// Every page-table transition, legal and illegal, and the block-level operations around them.
#include "scheduler/page_table.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tests/scheduler/page_table_test_util.hpp"

namespace kvtier {
namespace {

using pt_test::content_key;
using pt_test::TableRig;

constexpr uint32_t kLayers = 4;

class PageTableTest : public ::testing::Test {
 protected:
  void SetUp() override { rebuild(/*hbm=*/64, /*host=*/64, /*nvme=*/16); }
  void TearDown() override {
    if (rig_.table) {
      Status s = rig_.table->audit();
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
  }
  void rebuild(uint32_t hbm, uint32_t host, int64_t nvme, uint32_t shards = 4) {
    rig_.table.reset();
    auto r = TableRig::make(kLayers, shards, hbm, host, nvme);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rig_ = std::move(r).value();
  }
  PageTable& pt() { return *rig_.table; }
  BlockInfo info(const BlockKey& k) {
    auto r = pt().lookup(k);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : BlockInfo{};
  }
  void create(const BlockKey& k, const BlockKey& parent = {}, uint32_t refs = 0) {
    Status s = pt().create_block(k, parent, refs);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  void ok(Status s) { ASSERT_TRUE(s.ok()) << s.to_string(); }
  // Brings one copy from absent to `target` through legal transitions.
  void drive(const BlockKey& k, const CopyId& c, CopyState target) {
    if (target == CopyState::kAbsent) return;
    ASSERT_TRUE(pt().begin_fill(k, c).ok());
    if (target == CopyState::kFilling) return;
    ok(pt().complete_fill(k, c));
    if (target == CopyState::kReady) return;
    ok(pt().begin_drain(k, c));
  }
  // Blocks content_key(1..n), every layer ready in HBM.
  std::vector<BlockKey> resident_blocks(uint64_t n) {
    std::vector<BlockKey> keys;
    for (uint64_t i = 0; i < n; ++i) {
      keys.push_back(content_key(i + 1));
      create(keys.back());
      for (uint32_t l = 0; l < kLayers; ++l) drive(keys.back(), CopyId::hbm(l), CopyState::kReady);
    }
    return keys;
  }
  // Pins the page until it has the most pins it can; returns how many pins that took.
  uint32_t pin_to_the_limit(const BlockKey& k, uint32_t layer) {
    uint32_t pins = 0;
    while (pt().pin(k, layer).ok()) ++pins;
    return pins;
  }
  // Brings one copy back to absent (freeing its frame).
  void clear(const BlockKey& k, const CopyId& c) {
    const BlockInfo i = info(k);
    const CopyState s = c.tier == Tier::kNvme  ? i.nvme
                        : c.tier == Tier::kHbm ? i.pages[c.layer].hbm
                                               : i.pages[c.layer].host;
    switch (s) {
      case CopyState::kAbsent: break;
      case CopyState::kFilling: ok(pt().abort_fill(k, c)); break;
      case CopyState::kReady: ok(pt().drop(k, c)); break;
      case CopyState::kDraining: ok(pt().complete_drain(k, c)); break;
    }
  }

  TableRig rig_;
};

CopyState state_of(const BlockInfo& i, const CopyId& c) {
  if (c.tier == Tier::kNvme) return i.nvme;
  return c.tier == Tier::kHbm ? i.pages[c.layer].hbm : i.pages[c.layer].host;
}

// ---------------------------------------------------------------------------------------------
// The full transition matrix: every (tier, state, operation), legal ones move the state and the
// allocator's count as the diagram says, illegal ones fail with a message naming the copy and
// change nothing.
// ---------------------------------------------------------------------------------------------

enum class Op {
  kBeginFill,
  kCompleteFill,
  kAbortFill,
  kBeginDrain,
  kCompleteDrain,
  kCancelDrain,
  kDrop
};
constexpr Op kAllOps[] = {Op::kBeginFill,     Op::kCompleteFill, Op::kAbortFill, Op::kBeginDrain,
                          Op::kCompleteDrain, Op::kCancelDrain,  Op::kDrop};
constexpr CopyState kAllStates[] = {CopyState::kAbsent, CopyState::kFilling, CopyState::kReady,
                                    CopyState::kDraining};

const char* op_name(Op op) {
  switch (op) {
    case Op::kBeginFill: return "begin_fill";
    case Op::kCompleteFill: return "complete_fill";
    case Op::kAbortFill: return "abort_fill";
    case Op::kBeginDrain: return "begin_drain";
    case Op::kCompleteDrain: return "complete_drain";
    case Op::kCancelDrain: return "cancel_drain";
    case Op::kDrop: return "drop";
  }
  return "?";
}

std::optional<CopyState> legal_target(CopyState from, Op op) {
  switch (op) {
    case Op::kBeginFill:
      if (from == CopyState::kAbsent) return CopyState::kFilling;
      break;
    case Op::kCompleteFill:
      if (from == CopyState::kFilling) return CopyState::kReady;
      break;
    case Op::kAbortFill:
      if (from == CopyState::kFilling) return CopyState::kAbsent;
      break;
    case Op::kBeginDrain:
      if (from == CopyState::kReady) return CopyState::kDraining;
      break;
    case Op::kCompleteDrain:
      if (from == CopyState::kDraining) return CopyState::kAbsent;
      break;
    case Op::kCancelDrain:
      if (from == CopyState::kDraining) return CopyState::kReady;
      break;
    case Op::kDrop:
      if (from == CopyState::kReady) return CopyState::kAbsent;
      break;
  }
  return std::nullopt;
}

Status apply(PageTable& pt, const BlockKey& k, const CopyId& c, Op op) {
  switch (op) {
    case Op::kBeginFill: return pt.begin_fill(k, c).status();
    case Op::kCompleteFill: return pt.complete_fill(k, c);
    case Op::kAbortFill: return pt.abort_fill(k, c);
    case Op::kBeginDrain: return pt.begin_drain(k, c);
    case Op::kCompleteDrain: return pt.complete_drain(k, c);
    case Op::kCancelDrain: return pt.cancel_drain(k, c);
    case Op::kDrop: return pt.drop(k, c);
  }
  return internal_error("unknown op");
}

TEST_F(PageTableTest, TransitionMatrixForEveryTierStateAndOperation) {
  uint64_t next_key = 1;
  const CopyId copies[] = {CopyId::hbm(2), CopyId::host(1), CopyId::nvme()};
  int legal = 0, illegal = 0;
  for (const CopyId& c : copies) {
    for (CopyState from : kAllStates) {
      for (Op op : kAllOps) {
        SCOPED_TRACE(std::string(tier_name(c.tier)) + " " + std::string(copy_state_name(from)) +
                     " " + op_name(op));
        const BlockKey k = content_key(next_key++);
        create(k);
        drive(k, c, from);
        const BlockInfo before = info(k);
        const uint32_t used_before = rig_.used(c.tier);
        Status s = apply(pt(), k, c, op);
        const std::optional<CopyState> to = legal_target(from, op);
        if (to) {
          ++legal;
          ASSERT_TRUE(s.ok()) << s.to_string();
          const BlockInfo after = info(k);
          EXPECT_EQ(state_of(after, c), *to);
          const int delta = (from == CopyState::kAbsent) - (*to == CopyState::kAbsent);
          EXPECT_EQ(static_cast<int>(rig_.used(c.tier)), static_cast<int>(used_before) + delta);
          EXPECT_EQ(before.nvme_generation != after.nvme_generation,
                    c.tier == Tier::kNvme && op == Op::kBeginFill);
        } else {
          ++illegal;
          ASSERT_FALSE(s.ok());
          EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
          EXPECT_NE(s.message().find(to_string(k)), std::string::npos) << s.message();
          EXPECT_NE(s.message().find(tier_name(c.tier)), std::string::npos) << s.message();
          EXPECT_NE(s.message().find(copy_state_name(from)), std::string::npos) << s.message();
          EXPECT_NE(s.message().find(op_name(op)), std::string::npos) << s.message();
          if (c.tier != Tier::kNvme) {
            EXPECT_NE(s.message().find("layer " + std::to_string(c.layer)), std::string::npos)
                << s.message();
          }
          EXPECT_EQ(info(k), before) << "an illegal transition changed the entry";
          EXPECT_EQ(rig_.used(c.tier), used_before);
        }
        ok(pt().audit());
        clear(k, c);
        ok(pt().erase(k));
      }
    }
  }
  EXPECT_EQ(legal, 3 * 7);
  EXPECT_EQ(illegal, 3 * (4 * 7 - 7));
  EXPECT_EQ(pt().size(), 0u);
  EXPECT_EQ(rig_.used(Tier::kHbm) + rig_.used(Tier::kHost) + rig_.used(Tier::kNvme), 0u);
}

TEST_F(PageTableTest, FramesAreTheAllocatorsAndDistinct) {
  const BlockKey k = content_key(1);
  create(k);
  std::set<uint32_t> hbm_frames;
  for (uint32_t l = 0; l < kLayers; ++l) {
    auto f = pt().begin_fill(k, CopyId::hbm(l));
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE(rig_.hbm->is_allocated(*f));
    EXPECT_TRUE(hbm_frames.insert(*f).second);
    EXPECT_EQ(info(k).pages[l].hbm_frame, *f);
  }
  auto e = pt().begin_fill(k, CopyId::nvme());
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(rig_.nvme->is_allocated(*e));
  EXPECT_EQ(info(k).nvme_extent, *e);
  EXPECT_EQ(rig_.used(Tier::kHbm), kLayers);
  EXPECT_EQ(rig_.used(Tier::kNvme), 1u);
}

TEST_F(PageTableTest, NvmeGenerationsDetectStaleCompletions) {
  const BlockKey k = content_key(1);
  create(k);
  ASSERT_TRUE(pt().begin_fill(k, CopyId::nvme()).ok());
  const uint64_t g1 = info(k).nvme_generation;
  EXPECT_GT(g1, 0u);
  ok(pt().abort_fill(k, CopyId::nvme(g1)));
  ASSERT_TRUE(pt().begin_fill(k, CopyId::nvme()).ok());
  const uint64_t g2 = info(k).nvme_generation;
  EXPECT_GT(g2, g1);
  // The completion of the first, aborted write arrives late: refused, nothing changes.
  Status stale = pt().complete_fill(k, CopyId::nvme(g1));
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("stale generation"), std::string::npos) << stale.message();
  EXPECT_EQ(info(k).nvme, CopyState::kFilling);
  ok(pt().complete_fill(k, CopyId::nvme(g2)));
  EXPECT_EQ(info(k).nvme, CopyState::kReady);
  // begin_fill assigns generations itself.
  ok(pt().drop(k, CopyId::nvme()));
  EXPECT_EQ(pt().begin_fill(k, CopyId::nvme(7)).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PageTableTest, InvalidCopyIdsAreRejected) {
  const BlockKey k = content_key(1);
  create(k);
  const BlockInfo before = info(k);
  EXPECT_EQ(pt().begin_fill(k, CopyId::hbm(kLayers)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().begin_fill(k, CopyId{Tier::kNvme, 0, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().begin_fill(k, CopyId{Tier::kHost, 0, 5}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().begin_fill(k, CopyId{static_cast<Tier>(9), 0, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().pin(k, kLayers).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().unpin(k, kLayers).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(info(k), before);
  const BlockKey missing = content_key(2);
  Status s = pt().complete_fill(missing, CopyId::hbm(0));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(to_string(missing)), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Pins
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, PinsAreLegalOnFillingAndReadyHbmPagesOnly) {
  const BlockKey k = content_key(1);
  create(k);
  Status absent = pt().pin(k, 0).status();
  EXPECT_EQ(absent.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(absent.message().find("absent"), std::string::npos) << absent.message();
  EXPECT_NE(absent.message().find("layer 0"), std::string::npos) << absent.message();

  auto frame = pt().begin_fill(k, CopyId::hbm(0));
  ASSERT_TRUE(frame.ok());
  auto pinned = pt().pin(k, 0);  // filling: the engine writes the page during this step
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(*pinned, *frame);
  EXPECT_EQ(info(k).pages[0].pins, 1u);
  // A pinned filling page can complete but not be aborted.
  EXPECT_EQ(pt().abort_fill(k, CopyId::hbm(0)).code(), StatusCode::kFailedPrecondition);
  ok(pt().complete_fill(k, CopyId::hbm(0)));
  ASSERT_TRUE(pt().pin(k, 0).ok());  // ready
  EXPECT_EQ(info(k).pages[0].pins, 2u);
  // Neither drained nor dropped nor erased while pinned.
  const BlockInfo before = info(k);
  Status drain = pt().begin_drain(k, CopyId::hbm(0));
  EXPECT_EQ(drain.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(drain.message().find("pinned"), std::string::npos) << drain.message();
  EXPECT_EQ(pt().drop(k, CopyId::hbm(0)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pt().drop_all(k, Tier::kHbm).value_or(99), 0u);
  EXPECT_EQ(pt().erase(k).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(info(k), before);
  EXPECT_TRUE(rig_.hbm->is_allocated(*frame));
  // Host copies of a pinned page are independent of the HBM pin.
  ASSERT_TRUE(pt().begin_fill(k, CopyId::host(0)).ok());
  ok(pt().complete_fill(k, CopyId::host(0)));
  ok(pt().drop(k, CopyId::host(0)));

  ok(pt().unpin(k, 0));
  ok(pt().unpin(k, 0));
  Status below = pt().unpin(k, 0);
  EXPECT_EQ(below.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(below.message().find("below zero"), std::string::npos) << below.message();
  ok(pt().begin_drain(k, CopyId::hbm(0)));
  EXPECT_EQ(pt().pin(k, 0).status().code(), StatusCode::kFailedPrecondition);  // draining
  ok(pt().complete_drain(k, CopyId::hbm(0)));
  EXPECT_FALSE(rig_.hbm->is_allocated(*frame));
}

TEST_F(PageTableTest, PinCountSaturatesWithAnError) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::hbm(1), CopyState::kReady);
  const uint32_t pins = pin_to_the_limit(k, 1);
  EXPECT_EQ(pins, kMaxPins);
  EXPECT_EQ(pt().pin(k, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(info(k).pages[1].pins, kMaxPins);
  for (uint32_t i = 0; i < pins; ++i) ok(pt().unpin(k, 1));
}

TEST_F(PageTableTest, PinLayerIsAllOrNothing) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 6; ++i) {
    keys.push_back(content_key(i + 1));
    create(keys.back());
    drive(keys.back(), CopyId::hbm(3), CopyState::kReady);
  }
  std::vector<uint32_t> frames(keys.size());
  ok(pt().pin_layer(keys, 3, frames));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(frames[i], info(keys[i]).pages[3].hbm_frame);
    EXPECT_EQ(info(keys[i]).pages[3].pins, 1u);
  }
  ok(pt().unpin_layer(keys, 3));
  // One block not in HBM: nothing stays pinned.
  ok(pt().drop(keys[4], CopyId::hbm(3)));
  Status s = pt().pin_layer(keys, 3, frames);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(to_string(keys[4])), std::string::npos) << s.message();
  for (const BlockKey& k : keys) EXPECT_EQ(info(k).pages[3].pins, 0u);
  EXPECT_EQ(pt().pin_layer(keys, 3, std::span<uint32_t>(frames).first(2)).code(),
            StatusCode::kInvalidArgument);
  // A block that is not in the table at all: same.
  std::vector<BlockKey> with_missing = keys;
  with_missing[4] = content_key(999);
  EXPECT_EQ(pt().pin_layer(with_missing, 3, frames).code(), StatusCode::kNotFound);
  for (const BlockKey& k : keys) EXPECT_EQ(info(k).pages[3].pins, 0u);
  // The same block twice is pinned twice.
  const std::vector<BlockKey> twice = {keys[0], keys[1], keys[0]};
  std::vector<uint32_t> three(3);
  ok(pt().pin_layer(twice, 3, three));
  EXPECT_EQ(three[0], three[2]);
  EXPECT_EQ(info(keys[0]).pages[3].pins, 2u);
  ok(pt().unpin_layer(twice, 3));
  EXPECT_EQ(info(keys[0]).pages[3].pins, 0u);
  // unpin_layer reports the first failure but unpins everything it can.
  ASSERT_TRUE(pt().pin(keys[0], 3).ok());
  Status u = pt().unpin_layer(std::span<const BlockKey>(keys).first(2), 3);
  EXPECT_EQ(u.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(info(keys[0]).pages[3].pins, 0u);
}

TEST_F(PageTableTest, PinLayersFillsOneBlockTablePerLayerAllOrNothing) {
  const std::vector<BlockKey> keys = resident_blocks(5);
  const std::size_t n = keys.size();
  std::vector<uint32_t> frames(n * 3);
  ok(pt().pin_layers(keys, 1, 3, frames));
  for (std::size_t i = 0; i < n; ++i) {
    const BlockInfo b = info(keys[i]);
    EXPECT_EQ(b.pages[0].pins, 0u);
    for (uint32_t c = 0; c < 3; ++c) {
      EXPECT_EQ(frames[c * n + i], b.pages[1 + c].hbm_frame) << "block " << i << " layer " << c;
      EXPECT_EQ(b.pages[1 + c].pins, 1u);
    }
  }
  ok(pt().unpin_layers(keys, 1, 3));
  // The last layer of one block is not in HBM: nothing may stay pinned, on any layer.
  ok(pt().drop(keys[3], CopyId::hbm(3)));
  Status s = pt().pin_layers(keys, 0, kLayers, frames);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);  // frames too short
  std::vector<uint32_t> all(n * kLayers);
  s = pt().pin_layers(keys, 0, kLayers, all);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("layer 3"), std::string::npos) << s.message();
  for (const BlockKey& k : keys) {
    for (const PageInfo& p : info(k).pages) EXPECT_EQ(p.pins, 0u);
  }
  EXPECT_EQ(pt().pin_layers(keys, 2, kLayers, all).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().unpin_layers(keys, kLayers, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(pt().pin_layers(keys, 0, 0, {}).ok());
}

// The step's fast path: a page is pinned only when its HBM copy is ready, and anything else
// leaves the entry exactly as it was (the caller then takes the general path).
TEST_F(PageTableTest, PinReadyPinsOnlyAReadyHbmPage) {
  const BlockKey k = content_key(1);
  create(k);
  EXPECT_FALSE(pt().pin_ready(k, 0).has_value()) << "absent";
  auto frame = pt().begin_fill(k, CopyId::hbm(0));
  ASSERT_TRUE(frame.ok());
  EXPECT_FALSE(pt().pin_ready(k, 0).has_value()) << "filling: pin() takes it, pin_ready not";
  EXPECT_EQ(info(k).pages[0].pins, 0u);
  ok(pt().complete_fill(k, CopyId::hbm(0)));
  const std::optional<uint32_t> pinned = pt().pin_ready(k, 0);
  ASSERT_TRUE(pinned.has_value());
  EXPECT_EQ(*pinned, *frame);
  EXPECT_EQ(info(k).pages[0].pins, 1u);
  EXPECT_FALSE(pt().pin_ready(content_key(2), 0).has_value()) << "unknown block";
  EXPECT_FALSE(pt().pin_ready(k, kLayers).has_value()) << "past the last layer";
  EXPECT_FALSE(pt().pin_ready(BlockKey{}, 0).has_value()) << "the null key names no block";
  pin_to_the_limit(k, 0);
  EXPECT_EQ(info(k).pages[0].pins, kMaxPins);
  EXPECT_FALSE(pt().pin_ready(k, 0).has_value()) << "at the most pins a page can have";
  EXPECT_EQ(info(k).pages[0].pins, kMaxPins);
  for (uint32_t i = 0; i < kMaxPins; ++i) ok(pt().unpin(k, 0));
}

// A step that is not windowed pins each block resident in every layer with one block pin: a block
// with any page not ready is left alone entirely, so the general path sees it untouched.
TEST_F(PageTableTest, PinBlocksReadyPinsWholeResidentBlocksOnceAndLeavesTheRest) {
  std::vector<BlockKey> keys = resident_blocks(5);
  ok(pt().drop(keys[1], CopyId::hbm(2)));                       // one page missing
  ASSERT_TRUE(pt().begin_drain(keys[3], CopyId::hbm(0)).ok());  // one page leaving
  keys.push_back(BlockKey{});                                   // names no block
  keys.push_back(keys[0]);                                      // listed twice: pinned twice
  const std::size_t n = keys.size();
  std::vector<uint32_t> frames(n * kLayers, 0);
  std::vector<uint8_t> pinned(n, 7);
  auto blocks = pt().pin_blocks_ready(keys, frames, pinned);
  ASSERT_TRUE(blocks.ok()) << blocks.status().to_string();
  EXPECT_EQ(*blocks, 4u);
  EXPECT_EQ(pinned, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 1}));
  for (std::size_t i : {std::size_t{0}, std::size_t{2}, std::size_t{4}}) {
    const BlockInfo b = info(keys[i]);
    EXPECT_EQ(b.block_pins, i == 0 ? 2u : 1u) << "block " << i;
    for (uint32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(frames[i * kLayers + l], b.pages[l].hbm_frame) << "block " << i << " layer " << l;
      EXPECT_EQ(b.pages[l].pins, i == 0 ? 2u : 1u) << "block " << i << " layer " << l;
    }
  }
  for (std::size_t i : {std::size_t{1}, std::size_t{3}}) {
    EXPECT_EQ(info(keys[i]).block_pins, 0u);
    for (const PageInfo& p : info(keys[i]).pages) EXPECT_EQ(p.pins, 0u) << "block " << i;
  }
  ok(pt().complete_drain(keys[3], CopyId::hbm(0)));
  // Spans that do not fit: an error, and nothing pinned.
  std::vector<uint8_t> short_marks(n - 1);
  EXPECT_EQ(pt().pin_blocks_ready(keys, frames, short_marks).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(info(keys[2]).block_pins, 1u);

  // A block pin holds every page as page pins do: none can be drained, dropped or erased, and
  // the block is no eviction candidate.
  const BlockKey& held = keys[2];
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (Status s : {pt().begin_drain(held, CopyId::hbm(l)), pt().drop(held, CopyId::hbm(l))}) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(s.message().find("pinned"), std::string::npos) << s.message();
    }
  }
  auto dropped = pt().drop_all(held, Tier::kHbm);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 0u);
  EXPECT_EQ(pt().erase(held).code(), StatusCode::kFailedPrecondition);
  for (const EvictionCandidate& c : pt().eviction_candidates(Tier::kHbm)) {
    EXPECT_NE(c.key, held) << "a block pinned whole has nothing to evict";
  }
  // It is not a page pin: unpinning the pages says they are not pinned, and changes nothing.
  Status s = pt().unpin_layers(std::vector<BlockKey>{held}, 0, kLayers);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not pinned"), std::string::npos) << s.message();
  EXPECT_EQ(info(held).block_pins, 1u);

  // Split into page pins of the first two layers: those stay pinned, the others are free.
  auto left = pt().split_block_pins(std::vector<BlockKey>{held}, 0, 2);
  ASSERT_TRUE(left.ok()) << left.status().to_string();
  EXPECT_TRUE(left->empty());
  BlockInfo b = info(held);
  EXPECT_EQ(b.block_pins, 0u);
  EXPECT_EQ(b.pages[0].pins, 1u);
  EXPECT_EQ(b.pages[1].pins, 1u);
  EXPECT_EQ(b.pages[2].pins, 0u);
  EXPECT_EQ(b.pages[3].pins, 0u);
  ok(pt().drop(held, CopyId::hbm(3)));
  // A block without a block pin, or one the table does not hold, is left as it was, and named.
  const std::vector<BlockKey> cannot = {held, content_key(999)};
  left = pt().split_block_pins(cannot, 0, 1);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, cannot);
  EXPECT_EQ(pt().split_block_pins(cannot, 1, kLayers).status().code(),
            StatusCode::kInvalidArgument);
  ok(pt().unpin_layers(std::vector<BlockKey>{held}, 0, 2));
  // A page at the most pins of its own cannot take a split block pin: the block pin stays.
  pin_to_the_limit(keys[4], 1);
  left = pt().split_block_pins(std::vector<BlockKey>{keys[4]}, 0, 2);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 1u);
  EXPECT_EQ(info(keys[4]).block_pins, 1u);
  EXPECT_EQ(info(keys[4]).pages[0].pins, 1u);
  for (uint32_t i = 0; i < kMaxPins; ++i) ok(pt().unpin(keys[4], 1));
}

TEST_F(PageTableTest, BlockPinsAreReleasedWhereTheySitAndLookedUpWhenNotThere) {
  const std::vector<BlockKey> keys = resident_blocks(4);
  std::vector<uint32_t> frames(keys.size() * kLayers);
  std::vector<uint8_t> pinned(keys.size());
  PageTable::PinnedEntries where;
  where.entries.push_back({0, 0, content_key(77)});  // what it held before is dropped
  auto blocks = pt().pin_blocks_ready(keys, frames, pinned, &where);
  ASSERT_TRUE(blocks.ok()) << blocks.status().to_string();
  ASSERT_EQ(where.entries.size(), keys.size());
  std::vector<BlockKey> listed;
  for (const auto& e : where.entries) listed.push_back(e.key);
  EXPECT_TRUE(std::is_permutation(listed.begin(), listed.end(), keys.begin()));
  // Twice, so that each release below is seen.
  ok(pt().pin_blocks_ready(keys, frames, pinned).status());
  // An entry whose slot holds another block is looked up by its key: each block is released once
  // (twice would take the pin the second pass below releases).
  PageTable::PinnedEntries moved = where;
  moved.entries[0].slot = moved.entries[1].slot;
  moved.entries[0].shard = moved.entries[1].shard;
  ok(pt().unpin_blocks(moved));
  for (const BlockKey& k : keys) EXPECT_EQ(info(k).block_pins, 1u) << to_string(k);
  ok(pt().unpin_blocks(where));
  for (const BlockKey& k : keys) {
    EXPECT_EQ(info(k).block_pins, 0u);
    for (const PageInfo& p : info(k).pages) EXPECT_EQ(p.pins, 0u);
  }
  // Below zero, and a block the table does not hold past a slot never used: each named.
  Status s = pt().unpin_blocks(where);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no block pin"), std::string::npos) << s.message();
  PageTable::PinnedEntries unknown;
  unknown.entries.push_back({0, 1u << 30, content_key(999)});
  s = pt().unpin_blocks(unknown);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(to_string(content_key(999))), std::string::npos) << s.message();
}

// ---------------------------------------------------------------------------------------------
// Allocation through the tiers
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, ExhaustedTierFailsWithoutChangingAnything) {
  rebuild(/*hbm=*/3, /*host=*/8, /*nvme=*/1);
  const BlockKey k = content_key(1);
  create(k);
  for (uint32_t l = 0; l < 3; ++l) ASSERT_TRUE(pt().begin_fill(k, CopyId::hbm(l)).ok());
  const BlockInfo before = info(k);
  auto r = pt().begin_fill(k, CopyId::hbm(3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("hbm"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(to_string(k)), std::string::npos);
  EXPECT_EQ(info(k), before);
  EXPECT_EQ(rig_.used(Tier::kHbm), 3u);
  // Freeing one frame makes room again.
  ok(pt().abort_fill(k, CopyId::hbm(0)));
  EXPECT_TRUE(pt().begin_fill(k, CopyId::hbm(3)).ok());
}

TEST_F(PageTableTest, UnconfiguredTierIsUnavailable) {
  rebuild(/*hbm=*/8, /*host=*/8, /*nvme=*/-1);
  const BlockKey k = content_key(1);
  create(k);
  auto r = pt().begin_fill(k, CopyId::nvme());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("nvme"), std::string::npos);
  EXPECT_EQ(info(k).nvme, CopyState::kAbsent);
}

TEST_F(PageTableTest, DestroyingTheTableReturnsItsFrames) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::hbm(0), CopyState::kReady);
  drive(k, CopyId::host(1), CopyState::kDraining);
  drive(k, CopyId::nvme(), CopyState::kFilling);
  EXPECT_EQ(rig_.used(Tier::kHbm) + rig_.used(Tier::kHost) + rig_.used(Tier::kNvme), 3u);
  rig_.table.reset();
  EXPECT_EQ(rig_.used(Tier::kHbm) + rig_.used(Tier::kHost) + rig_.used(Tier::kNvme), 0u);
  ok(rig_.hbm->audit());
}

// A fill whose transfer may still write its frame (a read a hung drive holds) is abandoned: the
// copy is absent at once, and its frame stays allocated, held by the table and counted by the
// audit, until released; destroying the table returns it too.
TEST_F(PageTableTest, AnAbandonedFillHoldsItsFrameUntilReleased) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::host(0), CopyState::kFilling);
  drive(k, CopyId::host(1), CopyState::kFilling);
  const uint32_t frame0 = info(k).pages[0].host_frame;
  auto held = pt().abandon_fill(k, CopyId::host(0));
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  EXPECT_EQ(*held, frame0);
  EXPECT_EQ(info(k).pages[0].host, CopyState::kAbsent);
  EXPECT_EQ(pt().held_frames(Tier::kHost), 1u);
  EXPECT_EQ(rig_.used(Tier::kHost), 2u);
  ok(pt().audit());
  // Only a copy being filled is abandoned, and only a held frame released.
  EXPECT_EQ(pt().abandon_fill(k, CopyId::host(0)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pt().release_held_frame(Tier::kHost, info(k).pages[1].host_frame).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(pt().release_held_frame(Tier::kHbm, frame0).code(), StatusCode::kFailedPrecondition);
  // The copy may be filled again meanwhile, into another frame.
  ASSERT_TRUE(pt().begin_fill(k, CopyId::host(0)).ok());
  EXPECT_NE(info(k).pages[0].host_frame, frame0);
  ok(pt().audit());
  ok(pt().release_held_frame(Tier::kHost, frame0));
  EXPECT_EQ(pt().held_frames(Tier::kHost), 0u);
  EXPECT_EQ(rig_.used(Tier::kHost), 2u);
  ok(pt().audit());

  ASSERT_TRUE(pt().abandon_fill(k, CopyId::host(1)).ok());
  rig_.table.reset();
  EXPECT_EQ(rig_.used(Tier::kHost), 0u);
}

TEST_F(PageTableTest, DropAllDropsReadyUnpinnedCopiesOnly) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::hbm(0), CopyState::kReady);
  drive(k, CopyId::hbm(1), CopyState::kReady);
  drive(k, CopyId::hbm(2), CopyState::kFilling);
  drive(k, CopyId::hbm(3), CopyState::kDraining);
  ASSERT_TRUE(pt().pin(k, 1).ok());
  auto n = pt().drop_all(k, Tier::kHbm);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  const BlockInfo i = info(k);
  EXPECT_EQ(i.pages[0].hbm, CopyState::kAbsent);
  EXPECT_EQ(i.pages[1].hbm, CopyState::kReady);
  EXPECT_EQ(i.pages[2].hbm, CopyState::kFilling);
  EXPECT_EQ(i.pages[3].hbm, CopyState::kDraining);
  drive(k, CopyId::nvme(), CopyState::kReady);
  EXPECT_EQ(pt().drop_all(k, Tier::kNvme).value_or(0), 1u);
  EXPECT_EQ(info(k).nvme, CopyState::kAbsent);
  ok(pt().unpin(k, 1));
}

// ---------------------------------------------------------------------------------------------
// Blocks: create, references, erase, parents
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, CreateStartsAbsentEverywhere) {
  const BlockKey k = content_key(1);
  create(k, content_key(99), 2);
  const BlockInfo i = info(k);
  EXPECT_EQ(i.key, k);
  EXPECT_EQ(i.parent, content_key(99));
  EXPECT_EQ(i.refcount, 2u);
  EXPECT_FALSE(i.linked);  // the parent is not in the table
  EXPECT_EQ(i.nvme, CopyState::kAbsent);
  EXPECT_FALSE(i.match_tier.has_value());
  EXPECT_FALSE(i.dirty);
  EXPECT_FALSE(i.checksum.has_value());
  ASSERT_EQ(i.pages.size(), kLayers);
  for (const PageInfo& p : i.pages) EXPECT_EQ(p, PageInfo{});
  EXPECT_EQ(i.stats.inserted, i.stats.last_access);
  EXPECT_EQ(i.stats.hits, 0u);
  EXPECT_TRUE(pt().contains(k));
  EXPECT_EQ(pt().size(), 1u);

  Status dup = pt().create_block(k, {});
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find(to_string(k)), std::string::npos);
  EXPECT_EQ(pt().create_block(BlockKey{}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().create_block(content_key(5), content_key(5)).code(), StatusCode::kInvalidArgument);
}

TEST_F(PageTableTest, ReferenceCounting) {
  const BlockKey k = content_key(1);
  create(k);
  ok(pt().acquire(k));
  ok(pt().acquire(k));
  EXPECT_EQ(info(k).refcount, 2u);
  EXPECT_EQ(pt().release(k).value_or(99), 1u);
  Status busy = pt().erase(k);
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("references"), std::string::npos);
  EXPECT_EQ(pt().release(k).value_or(99), 0u);
  auto below = pt().release(k);
  EXPECT_EQ(below.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(below.status().message().find("below zero"), std::string::npos);
  EXPECT_EQ(info(k).refcount, 0u);
  ok(pt().erase(k));
  EXPECT_EQ(pt().erase(k).code(), StatusCode::kNotFound);
  EXPECT_EQ(pt().acquire(k).code(), StatusCode::kNotFound);
}

// The table counts blocks with references wherever a count leaves or reaches zero: creation,
// acquire and release, match with acquire, a committed update (not a rolled-back one) and publish.
TEST_F(PageTableTest, TheReferencedBlockCountFollowsEveryWayToReferenceABlock) {
  const BlockKey a = content_key(1);
  const BlockKey b = content_key(2);
  create(a);
  EXPECT_EQ(pt().referenced_blocks(), 0u);
  create(b, a, /*initial_refs=*/2);
  EXPECT_EQ(pt().referenced_blocks(), 1u);
  ok(pt().acquire(a));
  ok(pt().acquire(a));
  EXPECT_EQ(pt().referenced_blocks(), 2u) << "a block counts once, however many references";
  EXPECT_EQ(pt().release(a).value_or(99), 1u);
  EXPECT_EQ(pt().referenced_blocks(), 2u);
  EXPECT_EQ(pt().release(a).value_or(99), 0u);
  EXPECT_FALSE(pt().release(a).ok());
  EXPECT_EQ(pt().referenced_blocks(), 1u) << "a release below zero changes nothing";
  ok(pt().audit());

  // Match with acquire references the matched prefix; b already had references.
  for (uint32_t l = 0; l < kLayers; ++l) {
    drive(a, CopyId::hbm(l), CopyState::kReady);
    drive(b, CopyId::hbm(l), CopyState::kReady);
  }
  const std::vector<BlockKey> chain = {a, b};
  EXPECT_EQ(pt().match(chain, MatchOptions{.acquire = true}).blocks, 2u);
  EXPECT_EQ(pt().referenced_blocks(), 2u);
  ok(pt().audit());

  // An update counts when it commits, and not when it rolls back.
  ok(pt().update(a, [](EntryView& v) { return v.release().status(); }));
  EXPECT_EQ(pt().referenced_blocks(), 1u);
  EXPECT_EQ(pt().update(a,
                        [](EntryView& v) -> Status {
                          KVTIER_RETURN_IF_ERROR(v.acquire());
                          return cancelled("caller gave up");
                        })
                .code(),
            StatusCode::kCancelled);
  EXPECT_EQ(pt().referenced_blocks(), 1u);
  ok(pt().audit());

  // Publish moves a referenced private block under its key: still one block with references.
  const BlockKey priv = private_block_key(3, 0);
  create(priv, {}, 1);
  EXPECT_EQ(pt().referenced_blocks(), 2u);
  ASSERT_TRUE(pt().publish(priv, content_key(9)).ok());
  EXPECT_EQ(pt().referenced_blocks(), 2u);
  EXPECT_EQ(pt().release(content_key(9)).value_or(99), 0u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pt().release(b).ok());
  EXPECT_EQ(pt().referenced_blocks(), 0u);
  ok(pt().audit());
}

TEST_F(PageTableTest, EraseRefusesCopiesInFlightAndFreesReadyOnes) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::hbm(0), CopyState::kReady);
  drive(k, CopyId::host(0), CopyState::kReady);
  drive(k, CopyId::nvme(), CopyState::kReady);
  drive(k, CopyId::host(2), CopyState::kFilling);
  Status s = pt().erase(k);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("filling"), std::string::npos) << s.message();
  ok(pt().complete_fill(k, CopyId::host(2)));
  ok(pt().begin_drain(k, CopyId::nvme()));
  EXPECT_EQ(pt().erase(k).code(), StatusCode::kFailedPrecondition);
  ok(pt().cancel_drain(k, CopyId::nvme()));
  ok(pt().erase(k));
  EXPECT_EQ(rig_.used(Tier::kHbm) + rig_.used(Tier::kHost) + rig_.used(Tier::kNvme), 0u);
}

TEST_F(PageTableTest, CachedChildrenCountsAndBottomUpErase) {
  const BlockKey root = content_key(1), a = content_key(2), b = content_key(3), a1 = content_key(4);
  create(root);
  create(a, root);
  create(b, root);
  create(a1, a);
  EXPECT_EQ(info(root).cached_children, 2u);
  EXPECT_EQ(info(a).cached_children, 1u);
  EXPECT_TRUE(info(a1).linked);
  Status s = pt().erase(root);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("children"), std::string::npos) << s.message();
  ok(pt().erase(b));
  EXPECT_EQ(info(root).cached_children, 1u);
  EXPECT_EQ(pt().erase(a).code(), StatusCode::kFailedPrecondition);
  ok(pt().erase(a1));
  ok(pt().erase(a));
  EXPECT_EQ(info(root).cached_children, 0u);
  ok(pt().erase(root));
  // A child created before its parent is not counted (and does not block the parent's erase).
  create(a1, a);
  create(a, root);
  EXPECT_FALSE(info(a1).linked);
  EXPECT_EQ(info(a).cached_children, 0u);
  ok(pt().erase(a));
}

// ---------------------------------------------------------------------------------------------
// match
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, MatchCountsTheLongestCachedPrefixBySlowestTier) {
  std::vector<BlockKey> chain;
  for (uint64_t i = 0; i < 6; ++i) {
    chain.push_back(content_key(100 + i));
    create(chain.back(), i == 0 ? BlockKey{} : chain[i - 1]);
  }
  // 0: every page ready in HBM.
  for (uint32_t l = 0; l < kLayers; ++l) drive(chain[0], CopyId::hbm(l), CopyState::kReady);
  // 1: pages ready in HBM or host (mixed).
  for (uint32_t l = 0; l < kLayers; ++l) {
    drive(chain[1], l % 2 ? CopyId::hbm(l) : CopyId::host(l), CopyState::kReady);
  }
  // 2: only the NVMe extent, plus one HBM page.
  drive(chain[2], CopyId::nvme(), CopyState::kReady);
  drive(chain[2], CopyId::hbm(0), CopyState::kReady);
  // 3: all HBM.
  for (uint32_t l = 0; l < kLayers; ++l) drive(chain[3], CopyId::hbm(l), CopyState::kReady);
  // 4: one page missing (filling is not a copy yet), 5: all HBM but unreachable past 4.
  for (uint32_t l = 0; l < kLayers; ++l) {
    drive(chain[4], CopyId::hbm(l), l == 2 ? CopyState::kFilling : CopyState::kReady);
    drive(chain[5], CopyId::hbm(l), CopyState::kReady);
  }
  const uint64_t t0 = pt().now();
  MatchResult m = pt().match(chain);
  EXPECT_EQ(m.blocks, 4u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kHbm)], 2u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kHost)], 1u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kNvme)], 1u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(info(chain[i]).stats.hits, 1u);
    EXPECT_GT(info(chain[i]).stats.last_access, t0);
  }
  EXPECT_EQ(info(chain[4]).stats.hits, 0u);
  EXPECT_EQ(info(chain[5]).stats.hits, 0u);

  // Without recording: same answer, no statistics touched.
  const BlockInfo before = info(chain[0]);
  EXPECT_EQ(pt().match(chain, MatchOptions{.record_hits = false}), m);
  EXPECT_EQ(info(chain[0]).stats, before.stats);

  // A draining copy is leaving: block 0 drops to the host count once one page drains.
  ok(pt().begin_drain(chain[0], CopyId::hbm(3)));
  drive(chain[0], CopyId::host(3), CopyState::kReady);
  m = pt().match(chain, MatchOptions{.record_hits = false});
  EXPECT_EQ(m.blocks, 4u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kHbm)], 1u);
  EXPECT_EQ(m.by_tier[tier_index(Tier::kHost)], 2u);

  // Acquire-on-match references exactly the matched prefix.
  m = pt().match(chain, MatchOptions{.record_hits = true, .acquire = true});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(info(chain[i]).refcount, i < 4 ? 1u : 0u);

  // A missing first block matches nothing.
  const std::vector<BlockKey> other = {content_key(999), chain[0]};
  EXPECT_EQ(pt().match(other).blocks, 0u);
  EXPECT_EQ(pt().match({}).blocks, 0u);
}

// ---------------------------------------------------------------------------------------------
// Private blocks and publish
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, PublishMovesAPrivateBlockWithItsState) {
  const BlockKey parent = content_key(7);
  create(parent);
  // Enough blocks that both the same-shard and the cross-shard path are taken.
  for (uint64_t i = 0; i < 32; ++i) {
    const BlockKey priv = private_block_key(/*sequence=*/42, i);
    const BlockKey content = content_key(1000 + i);
    create(priv, parent, 1);
    EXPECT_EQ(pt().private_blocks(), 1u);
    drive(priv, CopyId::hbm(0), CopyState::kReady);
    drive(priv, CopyId::host(1), CopyState::kFilling);
    ASSERT_TRUE(pt().pin(priv, 0).ok());
    ok(pt().set_checksum(priv, 0xC0FFEE + i));
    BlockInfo before = info(priv);
    auto r = pt().publish(priv, content);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, PublishOutcome::kPublished);
    EXPECT_FALSE(pt().contains(priv));
    EXPECT_EQ(pt().private_blocks(), 0u) << "a published block is private no more";
    BlockInfo after = info(content);
    before.key = content;
    EXPECT_EQ(after, before);
    ok(pt().audit());
  }
  EXPECT_EQ(info(parent).cached_children, 32u);
  EXPECT_EQ(pt().size(), 33u);
}

TEST_F(PageTableTest, PublishOfAnAlreadyCachedBlockChangesNothing) {
  const BlockKey content = content_key(1);
  const BlockKey priv = private_block_key(5, 0);
  create(content, {}, 1);
  create(priv, {}, 1);
  drive(priv, CopyId::hbm(0), CopyState::kReady);
  const auto before = pt().snapshot();
  auto r = pt().publish(priv, content);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, PublishOutcome::kAlreadyCached);
  EXPECT_EQ(pt().snapshot(), before);
  EXPECT_EQ(pt().private_blocks(), 1u);
  // The caller then shares the existing block and drops its private copy.
  ok(pt().acquire(content));
  ok(pt().drop(priv, CopyId::hbm(0)));
  ASSERT_TRUE(pt().release(priv).ok());
  ok(pt().erase(priv));
  EXPECT_EQ(info(content).refcount, 2u);
  EXPECT_EQ(pt().private_blocks(), 0u);
  ok(pt().audit());
}

TEST_F(PageTableTest, PublishChecksItsArguments) {
  const BlockKey priv = private_block_key(5, 0);
  const BlockKey content = content_key(1);
  EXPECT_EQ(pt().publish(priv, content).status().code(), StatusCode::kNotFound);
  create(priv);
  EXPECT_EQ(pt().publish(content, priv).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().publish(priv, private_block_key(5, 1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pt().publish(priv, BlockKey{}).status().code(), StatusCode::kInvalidArgument);
  create(content_key(2), priv);  // a child of a private block would lose its parent key
  EXPECT_EQ(pt().publish(priv, content).status().code(), StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Compound updates and visits
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, UpdateCommitsACompoundChange) {
  const BlockKey k = content_key(1);
  create(k);
  ok(pt().update(k, [](EntryView& v) -> Status {
    for (uint32_t l = 0; l < v.layers(); ++l) {
      KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::hbm(l)).status());
      KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::hbm(l)));
    }
    KVTIER_RETURN_IF_ERROR(v.acquire());
    v.set_checksum(1234);
    return ok_status();
  }));
  const BlockInfo i = info(k);
  EXPECT_EQ(i.match_tier, Tier::kHbm);
  EXPECT_EQ(i.refcount, 1u);
  EXPECT_EQ(i.checksum, 1234u);
  EXPECT_TRUE(i.dirty);  // only in HBM
  EXPECT_EQ(rig_.used(Tier::kHbm), kLayers);
}

TEST_F(PageTableTest, UpdateThatFailsRollsBackStateAndFrames) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::host(0), CopyState::kReady);
  const BlockInfo before = info(k);
  const uint32_t host_frame = before.pages[0].host_frame;
  const uint32_t hbm_used = rig_.used(Tier::kHbm);
  Status s = pt().update(k, [](EntryView& v) -> Status {
    KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::hbm(0)).status());
    KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::hbm(0)));
    KVTIER_RETURN_IF_ERROR(v.drop(CopyId::host(0)));
    KVTIER_RETURN_IF_ERROR(v.acquire());
    return v.unpin(2);  // illegal: nothing pinned
  });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(info(k), before);
  EXPECT_EQ(rig_.used(Tier::kHbm), hbm_used);
  EXPECT_TRUE(rig_.host->is_allocated(host_frame));
  // A callback's own error is passed through unchanged.
  EXPECT_EQ(pt().update(k, [](EntryView&) { return cancelled("caller gave up"); }).code(),
            StatusCode::kCancelled);
  EXPECT_EQ(pt().update(content_key(2), [](EntryView&) { return ok_status(); }).code(),
            StatusCode::kNotFound);
}

TEST_F(PageTableTest, FreesInsideAnUpdateTakeEffectOnCommit) {
  const BlockKey k = content_key(1);
  create(k);
  drive(k, CopyId::hbm(0), CopyState::kReady);
  const uint32_t frame = info(k).pages[0].hbm_frame;
  ok(pt().update(k, [&](EntryView& v) -> Status {
    KVTIER_RETURN_IF_ERROR(v.drop(CopyId::hbm(0)));
    // Still held until commit, so the refill gets another frame.
    auto again = v.begin_fill(CopyId::hbm(0));
    if (!again.ok()) return again.status();
    return *again != frame ? ok_status() : internal_error("frame reused before commit");
  }));
  EXPECT_FALSE(rig_.hbm->is_allocated(frame));
  EXPECT_EQ(info(k).pages[0].hbm, CopyState::kFilling);
}

TEST_F(PageTableTest, VisitReadsOneEntryConsistently) {
  const BlockKey k = content_key(1);
  create(k, {}, 3);
  drive(k, CopyId::hbm(1), CopyState::kReady);
  drive(k, CopyId::host(1), CopyState::kReady);
  drive(k, CopyId::nvme(), CopyState::kFilling);
  uint32_t refs = 0, hbm = 0, host = 0;
  CopyState nvme = CopyState::kAbsent;
  bool dirty = false;
  ok(pt().visit(k, [&](const EntryView& v) {
    refs = v.refcount();
    hbm = v.copies(Tier::kHbm);
    host = v.copies(Tier::kHost);
    nvme = v.state(CopyId::nvme());
    dirty = v.dirty();
  }));
  EXPECT_EQ(refs, 3u);
  EXPECT_EQ(hbm, 1u);
  EXPECT_EQ(host, 1u);
  EXPECT_EQ(nvme, CopyState::kFilling);
  EXPECT_TRUE(dirty);
  EXPECT_EQ(pt().visit(content_key(2), [](const EntryView&) {}).code(), StatusCode::kNotFound);
}

TEST_F(PageTableTest, DirtyMeansTheMemoryTiersHoldTheOnlyValidCopy) {
  const BlockKey k = content_key(1);
  create(k);
  EXPECT_FALSE(info(k).dirty);
  drive(k, CopyId::hbm(0), CopyState::kFilling);
  EXPECT_FALSE(info(k).dirty);  // a filling copy is not data yet
  ok(pt().complete_fill(k, CopyId::hbm(0)));
  EXPECT_TRUE(info(k).dirty);
  drive(k, CopyId::nvme(), CopyState::kFilling);
  EXPECT_TRUE(info(k).dirty);
  ok(pt().complete_fill(k, CopyId::nvme()));
  EXPECT_FALSE(info(k).dirty);
  ok(pt().begin_drain(k, CopyId::nvme()));
  EXPECT_TRUE(info(k).dirty);
}

// ---------------------------------------------------------------------------------------------
// Eviction scans, snapshots, options
// ---------------------------------------------------------------------------------------------

TEST_F(PageTableTest, ScanSkipsPinnedPagesAndBlocksWithNothingToEvict) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 40; ++i) {
    keys.push_back(content_key(i + 1));
    create(keys.back());
  }
  for (uint64_t i = 0; i < 40; ++i) {
    if (i % 2 == 0) drive(keys[i], CopyId::hbm(0), CopyState::kReady);
    if (i % 4 == 0) {
      ASSERT_TRUE(pt().pin(keys[i], 0).ok());  // its only HBM page pinned: not evictable
    }
    if (i % 5 == 0) drive(keys[i], CopyId::host(2), CopyState::kReady);
  }
  std::set<BlockKey> expected_hbm, expected_host;
  for (uint64_t i = 0; i < 40; ++i) {
    if (i % 2 == 0 && i % 4 != 0) expected_hbm.insert(keys[i]);
    if (i % 5 == 0) expected_host.insert(keys[i]);
  }
  std::set<BlockKey> got;
  for (const EvictionCandidate& c : pt().eviction_candidates(Tier::kHbm)) {
    EXPECT_EQ(c.evictable, 1u);
    EXPECT_TRUE(c.dirty);
    EXPECT_TRUE(got.insert(c.key).second);
  }
  EXPECT_EQ(got, expected_hbm);
  got.clear();
  for (const EvictionCandidate& c : pt().eviction_candidates(Tier::kHost)) got.insert(c.key);
  EXPECT_EQ(got, expected_host);
  EXPECT_TRUE(pt().eviction_candidates(Tier::kNvme).empty());

  // Incremental: small batches visit the same set once per pass.
  got.clear();
  ScanCursor cursor;
  std::vector<EvictionCandidate> batch;
  int calls = 0;
  bool done = false;
  while (!done) {
    batch.clear();
    done = pt().scan_candidates(Tier::kHbm, cursor, 3, batch);
    EXPECT_LE(batch.size(), 3u);
    for (const auto& c : batch) EXPECT_TRUE(got.insert(c.key).second);
    ASSERT_LT(++calls, 1000);
  }
  EXPECT_EQ(got, expected_hbm);
  for (uint64_t i = 0; i < 40; i += 4) ok(pt().unpin(keys[i], 0));
}

TEST_F(PageTableTest, SnapshotListsEveryBlock) {
  for (uint64_t i = 0; i < 50; ++i) create(content_key(i + 1), i ? content_key(i) : BlockKey{});
  const auto snap = pt().snapshot();
  ASSERT_EQ(snap.size(), 50u);
  for (uint64_t i = 0; i < 50; ++i) {
    const auto it = snap.find(content_key(i + 1));
    ASSERT_NE(it, snap.end());
    EXPECT_EQ(it->second.cached_children, i < 49 ? 1u : 0u);
    EXPECT_EQ(it->second, info(content_key(i + 1)));
  }
  EXPECT_GT(pt().memory_bytes(), 0u);
}

TEST(PageTableCreate, RejectsBadOptions) {
  TierAllocators none;
  PageTableOptions o;
  o.layers = 0;
  EXPECT_EQ(PageTable::create(o, none).status().code(), StatusCode::kInvalidArgument);
  o.layers = PageTableOptions::kMaxLayers + 1;
  EXPECT_EQ(PageTable::create(o, none).status().code(), StatusCode::kInvalidArgument);
  o.layers = 32;
  o.shards = 12;
  EXPECT_EQ(PageTable::create(o, none).status().code(), StatusCode::kInvalidArgument);
  o.shards = 0;
  EXPECT_EQ(PageTable::create(o, none).status().code(), StatusCode::kInvalidArgument);
  o.shards = 1;
  o.expected_blocks = 100000;
  auto t = PageTable::create(o, none);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->shard_count(), 1u);
  EXPECT_EQ((*t)->layers(), 32u);
}

TEST(PageTableGrowth, ManyBlocksInOneShardStayIndexed) {
  auto rig = TableRig::make(2, 1, 16, 16, 4);
  ASSERT_TRUE(rig.ok());
  PageTable& pt = *rig->table;
  constexpr uint64_t kN = 5000;
  for (uint64_t i = 0; i < kN; ++i) ASSERT_TRUE(pt.create_block(content_key(i), {}).ok());
  for (uint64_t i = 0; i < kN; i += 2) ASSERT_TRUE(pt.erase(content_key(i)).ok());
  for (uint64_t i = 0; i < kN; ++i) EXPECT_EQ(pt.contains(content_key(i)), i % 2 == 1) << i;
  EXPECT_EQ(pt.size(), kN / 2);
  Status s = pt.audit();
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace kvtier
