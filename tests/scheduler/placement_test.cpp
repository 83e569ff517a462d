// Placement: the cost of planning room, counted (not timed). Demoting N blocks from HBM asks the
// host tier for room N times within one plan; the host's evictor must be walked about once in all,
// not from its cold end at every ask (which made planning quadratic and, with the links saturated,
// most of the scheduler's time). The plan itself is checked move by move.
#include "scheduler/placement.hpp"

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "scheduler/page_table.hpp"
#include "scheduler/policies/admission.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/shadowed_first.hpp"
#include "scheduler/policies/write_strategy.hpp"
#include "tests/scheduler/page_table_test_util.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {
namespace {

// Content keys (namespace tag 7): a key with tag 0 is private (BlockKey::is_private).
BlockKey key_of(uint64_t id) { return BlockKey{id, uint64_t{7} << 48}; }

// The plan's move of `id`'s copy in `from`; null when it does not move.
const PlannedMove* move_of(const PlacementPlan& plan, uint64_t id, Tier from) {
  for (const PlannedMove& m : plan.moves) {
    if (m.block.key == key_of(id) && m.from == from) return &m;
  }
  return nullptr;
}

// A ready copy of block `id`'s page `layer` in `tier` (the block exists already).
void add_ready_page(PageTable& table, Tier tier, uint64_t id, uint32_t layer = 0) {
  ASSERT_TRUE(table
                  .update(key_of(id),
                          [&](EntryView& v) -> Status {
                            const CopyId copy = CopyId::page(tier, layer);
                            KVTIER_RETURN_IF_ERROR(v.begin_fill(copy).status());
                            return v.complete_fill(copy);
                          })
                  .ok());
}

void track(Evictor& evictor, uint64_t id) {
  BlockFacts f;
  f.key = key_of(id);
  evictor.on_insert(f);
}

// A new one-layer block `id` with a ready page in `tier`, tracked by `evictor`.
void fill_block(PageTable& table, Tier tier, uint64_t id, Evictor& evictor) {
  ASSERT_TRUE(table.create_block(key_of(id), BlockKey{}).ok());
  add_ready_page(table, tier, id);
  track(evictor, id);
}

// An evictor that forwards to another and counts how it is asked for victims and admissions
// (refusing every newcomer when `refuse` is set).
class CountingEvictor final : public Evictor {
 public:
  explicit CountingEvictor(std::unique_ptr<Evictor> inner) : inner_(std::move(inner)) {}

  uint64_t select_calls = 0;
  uint64_t examined = 0;  // keys the placement's filter was asked about
  uint64_t admit_calls = 0;
  bool refuse = false;

  std::string_view name() const override { return inner_->name(); }
  void on_insert(const BlockFacts& block) override { inner_->on_insert(block); }
  void on_access(const BlockKey& key) override { inner_->on_access(key); }
  void on_erase(const BlockKey& key) override { inner_->on_erase(key); }
  void on_miss(const BlockFacts& block) override { inner_->on_miss(block); }
  bool admit(const BlockFacts& block) override {
    ++admit_calls;
    return !refuse && inner_->admit(block);
  }
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override {
    ++select_calls;
    const auto counted = [&](const BlockKey& k) {
      ++examined;
      return skip(k);
    };
    return inner_->select_victims(count, KeyFilter(counted), out);
  }
  void describe(const BlockKey& key, BlockFacts& facts) const override {
    inner_->describe(key, facts);
  }
  bool contains(const BlockKey& key) const override { return inner_->contains(key); }
  std::size_t size() const override { return inner_->size(); }
  std::size_t memory_bytes() const override { return inner_->memory_bytes(); }

 private:
  std::unique_ptr<Evictor> inner_;
};

class PlacementCost : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlocks = 512;  // in each tier, one page per block

  void SetUp() override {
    hbm_ = std::move(FrameAllocator::create(kBlocks)).value();
    host_ = std::move(FrameAllocator::create(kBlocks)).value();
    PageTableOptions o;
    o.layers = 1;
    o.shards = 4;
    table_ =
        std::move(PageTable::create(o, TierAllocators{hbm_.get(), host_.get(), nullptr})).value();
    EvictorOptions eo;
    eo.capacity_blocks = kBlocks;
    hbm_evictor_ = make_evictor(EvictionPolicy::kLru, eo);
    host_evictor_ = std::make_unique<CountingEvictor>(make_evictor(EvictionPolicy::kLru, eo));
    write_ = make_write_strategy(WritePolicy::kWriteBack, 2);
    // Blocks 0..511 fill HBM, 1000..1511 fill host memory, oldest first.
    for (uint64_t i = 0; i < kBlocks; ++i) {
      fill(Tier::kHbm, i, *hbm_evictor_);
      fill(Tier::kHost, 1000 + i, *host_evictor_);
    }
  }

  void fill(Tier tier, uint64_t id, Evictor& evictor) { fill_block(*table_, tier, id, evictor); }

  std::unique_ptr<FrameAllocator> hbm_, host_;
  std::unique_ptr<PageTable> table_;
  std::unique_ptr<Evictor> hbm_evictor_;
  std::unique_ptr<CountingEvictor> host_evictor_;
  std::unique_ptr<WriteStrategy> write_;
  NvmeAdmission admission_{0u};
};

TEST_F(PlacementCost, EveryTierIsWalkedAboutOnceForAWholePlan) {
  Placement placement(*table_, {hbm_evictor_.get(), host_evictor_.get(), nullptr}, admission_,
                      *write_);
  const PlacementPlan plan = placement.plan_room(Tier::kHbm, kBlocks, {0, 0, 0});
  EXPECT_EQ(plan.shortfall, 0u);
  ASSERT_EQ(plan.moves.size(), 2u * kBlocks);
  // Each HBM block goes to host memory after the oldest host block not yet chosen made room.
  for (uint64_t i = 0; i < kBlocks; ++i) {
    const PlannedMove& room = plan.moves[2 * i];
    const PlannedMove& down = plan.moves[2 * i + 1];
    EXPECT_EQ(room.block.key, key_of(1000 + i));
    EXPECT_EQ(room.from, Tier::kHost);
    EXPECT_FALSE(room.to.has_value());
    EXPECT_EQ(down.block.key, key_of(i));
    EXPECT_EQ(down.from, Tier::kHbm);
    EXPECT_EQ(down.to, Tier::kHost);
  }
  // 512 asks for one frame each: batches that double (1, 2, 4, ... 512) walk the host's list a
  // bounded number of times over, where asking afresh each time examined 1 + 2 + ... + 512.
  EXPECT_LE(host_evictor_->select_calls, 11u);
  EXPECT_LE(host_evictor_->examined, 4u * kBlocks);
}

// A block with pages in both tiers (an earlier eviction freed only some of its HBM pages) that
// HBM now demotes into a full host tier must not be chosen to make that room itself: its host
// pages would be dropped by the very plan that moves its other pages there.
TEST(PlacementCascade, TheBlockBeingDemotedIsNotTheRoomMadeForIt) {
  auto hbm = std::move(FrameAllocator::create(2)).value();
  auto host = std::move(FrameAllocator::create(2)).value();
  PageTableOptions o;
  o.layers = 2;
  o.shards = 1;
  auto table =
      std::move(PageTable::create(o, TierAllocators{hbm.get(), host.get(), nullptr})).value();
  EvictorOptions eo;
  eo.capacity_blocks = 2;
  auto hbm_evictor = make_evictor(EvictionPolicy::kLru, eo);
  auto host_evictor = make_evictor(EvictionPolicy::kLru, eo);
  auto write = make_write_strategy(WritePolicy::kWriteBack, 2);
  NvmeAdmission admission{0u};
  const auto page = [&](uint64_t id, Tier tier, uint32_t layer) {
    add_ready_page(*table, tier, id, layer);
  };
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(table->create_block(key_of(id), BlockKey{}).ok());
  // Block 1: layer 0 in host, layer 1 in HBM; the oldest in both tiers. Block 2 fills the rest
  // of host memory (layer 0), block 3 the rest of HBM (layer 0).
  page(1, Tier::kHost, 0);
  page(1, Tier::kHbm, 1);
  page(2, Tier::kHost, 0);
  page(3, Tier::kHbm, 0);
  for (uint64_t id : {1, 2}) track(*host_evictor, id);
  for (uint64_t id : {1, 3}) track(*hbm_evictor, id);
  Placement placement(*table, {hbm_evictor.get(), host_evictor.get(), nullptr}, admission, *write);
  const PlacementPlan plan = placement.plan_room(Tier::kHbm, 1, {0, 0, 0});
  EXPECT_EQ(plan.shortfall, 0u);
  bool demoted = false;
  for (const PlannedMove& m : plan.moves) {
    if (m.block.key != key_of(1)) continue;
    EXPECT_EQ(m.from, Tier::kHbm) << "block 1 was made the room for its own demotion";
    demoted |= m.from == Tier::kHbm && m.to == Tier::kHost;
  }
  EXPECT_TRUE(demoted);
}

// One-layer blocks in HBM and host memory (4 frames each), and a placement over them.
class PlacementOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    hbm_ = std::move(FrameAllocator::create(4)).value();
    host_ = std::move(FrameAllocator::create(4)).value();
    PageTableOptions o;
    o.layers = 1;
    o.shards = 1;
    table_ =
        std::move(PageTable::create(o, TierAllocators{hbm_.get(), host_.get(), nullptr})).value();
    write_ = make_write_strategy(WritePolicy::kWriteBack, 2);
  }

  void use(EvictionPolicy policy) {
    EvictorOptions eo;
    eo.capacity_blocks = 4;
    hbm_evictor_ = make_evictor(policy, eo);
    host_evictor_ = make_evictor(policy, eo);
    placement_.emplace(
        *table_, std::array<Evictor*, kNumTiers>{hbm_evictor_.get(), host_evictor_.get(), nullptr},
        admission_, *write_);
  }

  // Block `id` (child of `parent`, 0 for none, with `refs` references) with ready pages in
  // `tiers`, tracked by their evictors in creation order.
  void block(uint64_t id, std::vector<Tier> tiers, uint32_t refs = 0, uint64_t parent = 0) {
    const BlockKey p = parent == 0 ? BlockKey{} : key_of(parent);
    ASSERT_TRUE(table_->create_block(key_of(id), p, refs).ok());
    for (Tier t : tiers) {
      add_ready_page(*table_, t, id);
      BlockFacts f;
      f.key = key_of(id);
      f.parent = p;
      (t == Tier::kHbm ? *hbm_evictor_ : *host_evictor_).on_insert(f);
    }
  }

  // The blocks the plan moves out of `tier`, in plan order.
  static std::vector<BlockKey> leaving(const PlacementPlan& plan, Tier tier) {
    std::vector<BlockKey> out;
    for (const PlannedMove& m : plan.moves) {
      if (m.from == tier) out.push_back(m.block.key);
    }
    return out;
  }

  std::unique_ptr<FrameAllocator> hbm_, host_;
  std::unique_ptr<PageTable> table_;
  std::unique_ptr<Evictor> hbm_evictor_, host_evictor_;
  std::unique_ptr<WriteStrategy> write_;
  NvmeAdmission admission_{0u};
  std::optional<Placement> placement_;
};

// The oldest block, which an open sequence holds, leaves HBM only after every other block, whatever
// the policy's order.
TEST_F(PlacementOrder, ABlockAnOpenSequenceReadsLeavesOnlyWhenNothingElseCan) {
  use(EvictionPolicy::kLru);
  block(1, {Tier::kHbm}, /*refs=*/1);
  block(2, {Tier::kHbm});
  block(3, {Tier::kHbm});
  EXPECT_EQ(leaving(placement_->plan_room(Tier::kHbm, 1, {0, 4, 0}), Tier::kHbm),
            std::vector<BlockKey>{key_of(2)});
  const PlacementPlan all = placement_->plan_room(Tier::kHbm, 3, {0, 4, 0});
  EXPECT_EQ(all.shortfall, 0u);
  EXPECT_EQ(leaving(all, Tier::kHbm), (std::vector<BlockKey>{key_of(2), key_of(3), key_of(1)}));
}

// Below HBM the rule keeps what the sequence's next step would load from there: a copy that HBM
// shadows goes in the policy's order.
TEST_F(PlacementOrder, ACopyBelowThatHbmShadowsGoesAsAnyOther) {
  use(EvictionPolicy::kLru);
  block(1, {Tier::kHost}, /*refs=*/1);              // read from host memory next: kept
  block(2, {Tier::kHbm, Tier::kHost}, /*refs=*/1);  // shadowed by HBM
  block(3, {Tier::kHost});
  EXPECT_EQ(leaving(placement_->plan_room(Tier::kHost, 2, {3, 0, 0}), Tier::kHost),
            (std::vector<BlockKey>{key_of(2), key_of(3)}));
}

// prefix_aware gives up a chain tail first, each parent right after its child, within one plan:
// before, one plan offered only the chain's current tail and came up short.
TEST_F(PlacementOrder, PrefixAwareGivesUpAWholeChainInOnePlan) {
  use(EvictionPolicy::kPrefixAware);
  block(1, {Tier::kHbm});
  block(2, {Tier::kHbm}, 0, /*parent=*/1);
  block(3, {Tier::kHbm}, 0, /*parent=*/2);
  const PlacementPlan plan = placement_->plan_room(Tier::kHbm, 3, {0, 4, 0});
  EXPECT_EQ(plan.shortfall, 0u);
  EXPECT_EQ(leaving(plan, Tier::kHbm), (std::vector<BlockKey>{key_of(3), key_of(2), key_of(1)}));
}

// Two one-layer blocks' room in HBM and host memory, and optionally NVMe, with their placement.
class PlacementRig : public ::testing::Test {
 protected:
  // A fresh table (the old placement and table go first: its copies hold frames of the old
  // allocators).
  void reset_rig(bool with_nvme) {
    placement_.reset();
    rig_.table.reset();
    rig_ = std::move(pt_test::TableRig::make(1, 1, 2, 2, with_nvme ? 4 : -1)).value();
  }

  pt_test::TableRig rig_;
  std::unique_ptr<WriteStrategy> write_;
  NvmeAdmission admission_{0u};
  std::unique_ptr<Placement> placement_;
};

// Admission in the cascade: only the last configured tier refuses blocks, and only when it is
// full. A middle tier that refused a demotion would drop a block the tier below could keep (the
// lookahead policy's host tier refused 15,000 of them on a trace, below LRU's hit rate).
class PlacementAdmission : public PlacementRig {
 protected:
  void make(bool with_nvme) {
    reset_rig(with_nvme);
    EvictorOptions eo;
    eo.capacity_blocks = 2;
    for (auto& e : evictors_) {
      e = std::make_unique<CountingEvictor>(make_evictor(EvictionPolicy::kLru, eo));
      e->refuse = true;
    }
    write_ = make_write_strategy(WritePolicy::kWriteBack, 2);
    // HBM holds blocks 1 and 2, host memory 11 and 12, oldest first.
    for (uint64_t id : {1, 2}) fill(Tier::kHbm, id);
    for (uint64_t id : {11, 12}) fill(Tier::kHost, id);
    placement_ = std::make_unique<Placement>(
        *rig_.table,
        std::array<Evictor*, kNumTiers>{evictors_[0].get(), evictors_[1].get(),
                                        with_nvme ? evictors_[2].get() : nullptr},
        admission_, *write_);
  }

  void fill(Tier tier, uint64_t id) {
    fill_block(*rig_.table, tier, id, *evictors_[static_cast<std::size_t>(tier_index(tier))]);
  }

  // Where the plan sends `id`'s copy in `from`; nullopt for a drop, or when it does not move.
  static std::optional<Tier> destination(const PlacementPlan& plan, uint64_t id, Tier from,
                                         bool* moved) {
    const PlannedMove* m = move_of(plan, id, from);
    *moved = m != nullptr;
    return m != nullptr ? m->to : std::nullopt;
  }

  CountingEvictor& evictor(Tier t) { return *evictors_[static_cast<std::size_t>(tier_index(t))]; }

  std::array<std::unique_ptr<CountingEvictor>, kNumTiers> evictors_;
};

TEST_F(PlacementAdmission, HostAboveNvmeTakesEveryDemotion) {
  make(/*with_nvme=*/true);
  // NVMe has room: nothing leaves the cache, and no tier is asked.
  PlacementPlan plan = placement_->plan_room(Tier::kHbm, 1, {0, 0, 4});
  bool moved = false;
  EXPECT_EQ(destination(plan, 1, Tier::kHbm, &moved), Tier::kHost);
  EXPECT_TRUE(moved);
  EXPECT_EQ(destination(plan, 11, Tier::kHost, &moved), Tier::kNvme);
  EXPECT_TRUE(moved);
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 0u);
  EXPECT_EQ(evictor(Tier::kNvme).admit_calls, 0u);
  // NVMe full: the last tier is asked and refuses host's victim, which is dropped; host, though
  // its evictor refuses everything, still takes HBM's victim into the room that drop made.
  plan = placement_->plan_room(Tier::kHbm, 1, {0, 0, 0});
  EXPECT_EQ(destination(plan, 1, Tier::kHbm, &moved), Tier::kHost);
  EXPECT_TRUE(moved);
  EXPECT_EQ(destination(plan, 11, Tier::kHost, &moved), std::nullopt);
  EXPECT_TRUE(moved);
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 0u);
  EXPECT_GE(evictor(Tier::kNvme).admit_calls, 1u);
  EXPECT_EQ(placement_->counters().refused, 1u);
}

TEST_F(PlacementAdmission, HostAsTheLastTierIsAskedOnlyWhenFull) {
  make(/*with_nvme=*/false);
  bool moved = false;
  PlacementPlan plan = placement_->plan_room(Tier::kHbm, 1, {0, 1, 0});
  EXPECT_EQ(destination(plan, 1, Tier::kHbm, &moved), Tier::kHost);
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 0u);
  plan = placement_->plan_room(Tier::kHbm, 1, {0, 0, 0});
  EXPECT_EQ(destination(plan, 1, Tier::kHbm, &moved), std::nullopt);
  EXPECT_TRUE(moved);
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 1u);
  EXPECT_EQ(placement_->counters().refused, 1u);
}

TEST_F(PlacementAdmission, ANewBlockIsAskedOfTheTierThatWouldDropOne) {
  BlockFacts fresh;
  fresh.key = key_of(99);
  make(/*with_nvme=*/true);
  EXPECT_TRUE(placement_->admit_new(fresh, {0, 0, 1}));  // NVMe has room
  EXPECT_TRUE(placement_->admit_new(fresh, {0, 1, 0}));  // host has room
  EXPECT_EQ(evictor(Tier::kNvme).admit_calls, 0u);
  EXPECT_FALSE(placement_->admit_new(fresh, {0, 0, 0}));
  EXPECT_EQ(evictor(Tier::kNvme).admit_calls, 1u);
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 0u);
  EXPECT_EQ(evictor(Tier::kHbm).admit_calls, 0u);
  // Without NVMe, host decides.
  make(/*with_nvme=*/false);
  EXPECT_FALSE(placement_->admit_new(fresh, {0, 0, 0}));
  EXPECT_EQ(evictor(Tier::kHost).admit_calls, 1u);
  EXPECT_EQ(evictor(Tier::kHbm).admit_calls, 0u);
}

// Copies a promotion left below (shadowed: HBM holds the block in full). Under write_back the
// host tier drops such a copy first, without writing it down, and a block is never dropped from
// two tiers by one plan: block 1 leaves HBM as a clean drop (its host copy is below), so its host
// copy, though shadowed, stays, and host's room comes from block 2 instead.
class PlacementShadowed : public PlacementRig {
 protected:
  void make(WritePolicy policy) {
    reset_rig(/*with_nvme=*/true);
    write_ = make_write_strategy(policy, 2);
    EvictorOptions eo;
    eo.capacity_blocks = 2;
    for (Tier t : kAllTiers) {
      evictor(t) = shadowed_first(make_evictor(EvictionPolicy::kLru, eo), t, *write_);
    }
    // Host memory: block 1 (the oldest), then block 2. HBM: block 1 again (promoted), then 3.
    fill_block(*rig_.table, Tier::kHost, 1, *evictor(Tier::kHost));
    fill_block(*rig_.table, Tier::kHost, 2, *evictor(Tier::kHost));
    add_ready_page(*rig_.table, Tier::kHbm, 1);
    track(*evictor(Tier::kHbm), 1);
    fill_block(*rig_.table, Tier::kHbm, 3, *evictor(Tier::kHbm));
    std::array<Evictor*, kNumTiers> raw{};
    for (Tier t : kAllTiers) raw[static_cast<std::size_t>(tier_index(t))] = evictor(t).get();
    report_shadowed(*rig_.table, raw, key_of(1));
    placement_ = std::make_unique<Placement>(*rig_.table, raw, admission_, *write_);
  }

  std::unique_ptr<Evictor>& evictor(Tier t) {
    return evictors_[static_cast<std::size_t>(tier_index(t))];
  }

  std::array<std::unique_ptr<Evictor>, kNumTiers> evictors_;
};

TEST_F(PlacementShadowed, AShadowedCopyGoesFirstAndIsDroppedNotWrittenDown) {
  make(WritePolicy::kWriteBack);
  const PlacementPlan plan = placement_->plan_room(Tier::kHost, 1, {0, 0, 4});
  ASSERT_EQ(plan.moves.size(), 1u);
  const PlannedMove* m = move_of(plan, 1, Tier::kHost);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->shadowed);
  EXPECT_EQ(m->to, std::nullopt);
  EXPECT_EQ(placement_->counters().shadowed_drops, 1u);
  // Carried out, block 1 lives on in HBM, and host no longer counts it shadowed.
  std::array<Evictor*, kNumTiers> raw{};
  for (Tier t : kAllTiers) raw[static_cast<std::size_t>(tier_index(t))] = evictor(t).get();
  ASSERT_TRUE(execute_plan_metadata(*rig_.table, raw, plan).ok());
  EXPECT_TRUE(evictor(Tier::kHbm)->contains(key_of(1)));
  EXPECT_FALSE(evictor(Tier::kHost)->contains(key_of(1)));
  EXPECT_EQ(static_cast<ShadowedFirstEvictor&>(*evictor(Tier::kHost)).shadowed(), 0u);
}

TEST_F(PlacementShadowed, WriteThroughKeepsItsCopiesBelowInTheirOrder) {
  make(WritePolicy::kWriteThrough);
  const PlacementPlan plan = placement_->plan_room(Tier::kHost, 1, {0, 0, 4});
  const PlannedMove* m = move_of(plan, 1, Tier::kHost);  // the oldest, as LRU says
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->shadowed);
  EXPECT_EQ(m->to, Tier::kNvme);
  EXPECT_EQ(placement_->counters().shadowed_drops, 0u);
}

TEST_F(PlacementShadowed, ABlockIsNotDroppedFromTwoTiersInOnePlan) {
  make(WritePolicy::kWriteBack);
  // HBM needs both frames: block 1 leaves as a clean drop, block 3 goes down to host memory,
  // which makes room without NVMe (full): its shadowed block 1 must stay, block 2 goes.
  const PlacementPlan plan = placement_->plan_room(Tier::kHbm, 2, {0, 0, 0});
  const PlannedMove* hbm1 = move_of(plan, 1, Tier::kHbm);
  ASSERT_NE(hbm1, nullptr);
  EXPECT_TRUE(hbm1->clean_below);
  EXPECT_EQ(move_of(plan, 1, Tier::kHost), nullptr) << "block 1 would be lost";
  const PlannedMove* hbm3 = move_of(plan, 3, Tier::kHbm);
  ASSERT_NE(hbm3, nullptr);
  EXPECT_EQ(hbm3->to, Tier::kHost);
  EXPECT_NE(move_of(plan, 2, Tier::kHost), nullptr);
  EXPECT_EQ(plan.shortfall, 0u);
}

// Blocks whose pages can live only in HBM and host memory and must not be lost: private blocks
// (NVMe is addressed by content key), and, where there is no NVMe tier, blocks an open sequence
// holds.
enum class KeptKind { kPrivate, kInUseWithoutNvme };

// Two-layer blocks over LRU tiers with write-back and no admission threshold, with an NVMe tier
// for KeptKind::kPrivate and none for kInUseWithoutNvme: blocks kept in memory of that kind, and
// cached blocks that may be lost, are created, given ready pages, and tracked by a tier's evictor
// one by one, oldest first.

class TwoLayerRig {
 public:
  static constexpr uint32_t kLayers = 2;

  TwoLayerRig(KeptKind kind, uint32_t hbm_frames, uint32_t host_frames)
      : kind_(kind), write_(make_write_strategy(WritePolicy::kWriteBack, 2)), admission_(0u) {
    const int64_t nvme_extents = kind == KeptKind::kPrivate ? 4 : -1;
    auto made = pt_test::TableRig::make(kLayers, 1, hbm_frames, host_frames, nvme_extents);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (made.ok()) rig_ = std::move(made).value();
    EvictorOptions eo;
    eo.capacity_blocks = 4;
    for (Tier t : kAllTiers) {
      if (t != Tier::kNvme || nvme_extents >= 0) {
        evictors_[tier_index(t)] = make_evictor(EvictionPolicy::kLru, eo);
      }
    }
  }

  bool nvme() const { return kind_ == KeptKind::kPrivate; }
  // The n-th block that must stay in memory: private, or with content key and a reference.
  BlockKey kept(uint64_t n) {
    const BlockKey key = kind_ == KeptKind::kPrivate ? BlockKey{n, 0} : key_of(100 + n);
    EXPECT_TRUE(rig_.table->create_block(key, BlockKey{}, 1).ok());
    return key;
  }
  // A cached block no sequence holds.
  BlockKey cached(uint64_t n) {
    EXPECT_TRUE(rig_.table->create_block(key_of(n), BlockKey{}, 0).ok());
    return key_of(n);
  }
  void ready(const BlockKey& key, Tier tier, uint32_t layer) {
    fill(key, CopyId::page(tier, layer));
  }
  // Every page of `key` ready in `tier`, and the tier's evictor tracking it.
  void whole(const BlockKey& key, Tier tier) {
    for (uint32_t l = 0; l < kLayers; ++l) ready(key, tier, l);
    track(key, tier);
  }
  // One page of `key` ready in `tier`, and the tier's evictor tracking it.
  void one_page(const BlockKey& key, Tier tier, uint32_t layer) {
    ready(key, tier, layer);
    track(key, tier);
  }
  void track(const BlockKey& key, Tier tier) {
    BlockFacts f;
    f.key = key;
    evictors_[tier_index(tier)]->on_insert(f);
  }
  // A block with its content key that an open sequence holds.
  BlockKey in_use(uint64_t n) {
    EXPECT_TRUE(rig_.table->create_block(key_of(200 + n), BlockKey{}, 1).ok());
    return key_of(200 + n);
  }
  // Its NVMe copy ready (taking an extent), and NVMe's evictor tracking it.
  void on_nvme(const BlockKey& key) {
    fill(key, CopyId::nvme());
    track(key, Tier::kNvme);
  }
  // Room for `frames` in `tier`, with `host_free` host frames and `nvme_free` NVMe extents free,
  // and the blocks NVMe refuses.
  PlacementPlan plan_room(Tier tier, uint64_t frames, uint64_t host_free = 0,
                          uint64_t nvme_free = 4, KeyFilter nvme_refuses = KeyFilter::none()) {
    Placement placement(*rig_.table, evictors(), admission_, *write_);
    placement.set_nvme_refuses(nvme_refuses);
    return placement.plan_room(tier, frames, {0, host_free, nvme() ? nvme_free : 0u});
  }
  Result<ExecutionResult> execute(const PlacementPlan& plan) {
    return execute_plan_metadata(*rig_.table, evictors(), plan);
  }
  Result<BlockInfo> lookup(const BlockKey& key) const { return rig_.table->lookup(key); }

 private:
  // A complete copy of `key`, filled and ready at once.
  void fill(const BlockKey& key, const CopyId& copy) {
    ASSERT_TRUE(rig_.table
                    ->update(key,
                             [&](EntryView& v) -> Status {
                               KVTIER_RETURN_IF_ERROR(v.begin_fill(copy).status());
                               return v.complete_fill(copy);
                             })
                    .ok());
  }
  std::array<Evictor*, kNumTiers> evictors() const {
    std::array<Evictor*, kNumTiers> raw{};
    for (Tier t : kAllTiers) raw[tier_index(t)] = evictors_[tier_index(t)].get();
    return raw;
  }

  KeptKind kind_;
  pt_test::TableRig rig_;
  std::unique_ptr<WriteStrategy> write_;
  NvmeAdmission admission_;
  std::array<std::unique_ptr<Evictor>, kNumTiers> evictors_;
};

class PlacementKept : public ::testing::TestWithParam<KeptKind> {};

// A block kept in memory never goes to NVMe and is never lost: in host memory only its pages whose
// HBM copy is ready can leave, and only those count as freed. Host memory (2 layers, 4 frames)
// holds kept blocks P (both pages; HBM holds layer 1 again) and Q (both pages, nothing in HBM), and
// cached block 3 (both pages), oldest first.
TEST_P(PlacementKept, ABlockKeptInMemoryLeavesHostOnlyWhereHbmHoldsItsPages) {
  TwoLayerRig rig(GetParam(), /*hbm_frames=*/4, /*host_frames=*/6);
  const BlockKey p = rig.kept(1);
  const BlockKey q = rig.kept(2);
  const BlockKey c = rig.cached(3);
  for (const BlockKey& key : {p, q, c}) rig.whole(key, Tier::kHost);
  rig.ready(p, Tier::kHbm, 1);
  const PlacementPlan plan = rig.plan_room(Tier::kHost, 3);
  // Block 3 first (open sequences hold P and Q: they go last), to NVMe where there is one, then
  // P's one page; Q frees nothing.
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].block.key, c);
  EXPECT_EQ(plan.moves[0].to, rig.nvme() ? std::optional(Tier::kNvme) : std::nullopt);
  EXPECT_EQ(plan.moves[0].frames_freed, 2u);
  EXPECT_EQ(plan.moves[1].block.key, p);
  EXPECT_EQ(plan.moves[1].to, std::nullopt) << "a block kept in memory never goes to NVMe";
  EXPECT_EQ(plan.moves[1].frames_freed, 1u) << "only its page that HBM holds may leave";
  EXPECT_EQ(plan.shortfall, 0u);
}

// In HBM, a block kept in memory goes down to host memory or stays: with no host room, only its
// pages that host memory holds already may leave, and one with none is passed by (planning its
// drop would free nothing, round after round). HBM (2 layers, 4 frames) holds kept blocks P (both
// pages; host memory holds layer 0 too) and Q (both pages, none in host memory), oldest first;
// host memory is full: P's page and kept block R, which cannot leave it.
TEST_P(PlacementKept, ABlockKeptInMemoryLeavesHbmOnlyWhereHostHoldsItsPages) {
  TwoLayerRig rig(GetParam(), /*hbm_frames=*/4, /*host_frames=*/3);
  const BlockKey q = rig.kept(1);
  const BlockKey p = rig.kept(2);
  const BlockKey r = rig.kept(3);
  for (const BlockKey& key : {p, q}) rig.whole(key, Tier::kHbm);
  rig.one_page(p, Tier::kHost, 0);
  rig.whole(r, Tier::kHost);
  const PlacementPlan plan = rig.plan_room(Tier::kHbm, 3);
  ASSERT_EQ(plan.moves.size(), 1u) << "Q frees nothing: it is not in the plan";
  EXPECT_EQ(plan.moves[0].block.key, p);
  EXPECT_EQ(plan.moves[0].to, std::nullopt);
  EXPECT_EQ(plan.moves[0].frames_freed, 1u) << "only its page host memory holds may leave";
  EXPECT_EQ(plan.shortfall, 2u);
}

// Host memory with room for part of a block kept in memory takes that part: HBM and host memory
// full of such pages trade them one by one (a page goes down into the last free host frame, one a
// step needs comes up into the HBM frame it left) where a whole block would never fit. HBM (2
// layers, 4 frames) holds kept block Q (both pages); host memory (3 frames) holds kept block R,
// which cannot leave it, and has one frame free. Room for one HBM frame: Q's last layer goes down
// (a step reads it last), its first stays.
TEST_P(PlacementKept, HostRoomForPartOfABlockKeptInMemoryTakesThatPart) {
  TwoLayerRig rig(GetParam(), /*hbm_frames=*/4, /*host_frames=*/3);
  const BlockKey q = rig.kept(1);
  const BlockKey r = rig.kept(2);
  rig.whole(q, Tier::kHbm);
  rig.whole(r, Tier::kHost);
  const PlacementPlan plan = rig.plan_room(Tier::kHbm, 1, /*host_free=*/1);
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].block.key, q);
  EXPECT_EQ(plan.moves[0].to, Tier::kHost);
  EXPECT_EQ(plan.moves[0].pages_down, 1u);
  EXPECT_EQ(plan.moves[0].frames_taken, 1u);
  EXPECT_EQ(plan.moves[0].frames_freed, 1u);
  EXPECT_EQ(plan.shortfall, 0u);
  auto done = rig.execute(plan);
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  EXPECT_EQ(done->executed, 1u);
  auto info = rig.lookup(q);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->pages[0].hbm, CopyState::kReady) << "its first layer stays in HBM";
  EXPECT_EQ(info->pages[0].host, CopyState::kAbsent);
  EXPECT_EQ(info->pages[1].hbm, CopyState::kAbsent);
  EXPECT_EQ(info->pages[1].host, CopyState::kReady) << "its last layer went down";
}

// A block in use that NVMe refused (a write of it failed) is kept in memory like a private block:
// never planned toward NVMe, and host room for part of it takes that part. HBM (2 layers, 4
// frames) holds U, in use (both pages); host memory (3 frames) holds kept block R and has one
// frame free. Planned as a block that could go to NVMe, U was demoted whole or not at all: with
// one host frame it stayed, its drop refused, and a step waiting for HBM frames waited for ever
// (seed 1310 of the wide sweep, with HBM and host memory full of blocks in use).
TEST(PlacementInUse, ABlockInUseThatNvmeRefusedIsKeptInMemory) {
  TwoLayerRig rig(KeptKind::kPrivate, /*hbm_frames=*/4, /*host_frames=*/3);
  const BlockKey u = rig.in_use(1);
  const BlockKey r = rig.kept(1);
  rig.whole(u, Tier::kHbm);
  rig.whole(r, Tier::kHost);
  const auto refuses_u = [&](const BlockKey& key) { return key == u; };
  const PlacementPlan plan =
      rig.plan_room(Tier::kHbm, 1, /*host_free=*/1, /*nvme_free=*/4, KeyFilter(refuses_u));
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].block.key, u);
  EXPECT_EQ(plan.moves[0].to, Tier::kHost);
  EXPECT_EQ(plan.moves[0].pages_down, 1u) << "its last layer goes down, its first stays";
  EXPECT_EQ(plan.shortfall, 0u);
  // Not refused, U could go to NVMe: it is not kept in memory, and is not split.
  const PlacementPlan free_to_go = rig.plan_room(Tier::kHbm, 1, /*host_free=*/1);
  for (const PlannedMove& m : free_to_go.moves) EXPECT_EQ(m.pages_down, 0u);
}

// In host memory, a block in use that NVMe refused is never demoted there: its pages stay (HBM
// holds none of them). Not refused, it would go to NVMe whole.
TEST(PlacementInUse, ABlockInUseThatNvmeRefusedIsNotSentThere) {
  TwoLayerRig rig(KeptKind::kPrivate, /*hbm_frames=*/4, /*host_frames=*/2);
  const BlockKey u = rig.in_use(1);
  rig.whole(u, Tier::kHost);
  const PlacementPlan free_to_go = rig.plan_room(Tier::kHost, 2);
  ASSERT_EQ(free_to_go.moves.size(), 1u);
  EXPECT_EQ(free_to_go.moves[0].to, Tier::kNvme);
  const auto refuses_u = [&](const BlockKey& key) { return key == u; };
  const PlacementPlan plan =
      rig.plan_room(Tier::kHost, 2, /*host_free=*/0, /*nvme_free=*/4, KeyFilter(refuses_u));
  for (const PlannedMove& m : plan.moves) {
    EXPECT_FALSE(m.block.key == u && m.to == Tier::kNvme) << "sent to NVMe, which refused it";
  }
  EXPECT_EQ(plan.shortfall, 2u) << "its pages are its last copies";
}

// NVMe smaller than the blocks in use: its 4 extents hold blocks open sequences read from there
// (their only copy), and host memory (2 layers, 4 frames) holds block U in use, with no NVMe copy
// (HBM holds its layer 1 too), and kept block R. Room for 2 host frames: nothing on NVMe may be
// dropped, so U cannot be written there, and only its page HBM holds may leave. Before, the plan
// dropped an NVMe block and wrote U in its place, which the executor refused; host memory then
// never got the room HBM's plans had demoted into, round after round at one instant.
TEST(PlacementInUse, ABlockInUseThatNvmeCannotTakeLeavesHostOnlyWhereHbmHoldsItsPages) {
  TwoLayerRig rig(KeptKind::kPrivate, /*hbm_frames=*/4, /*host_frames=*/4);
  for (uint64_t n = 1; n <= 4; ++n) rig.on_nvme(rig.in_use(n));
  const BlockKey r = rig.kept(1);
  const BlockKey u = rig.in_use(5);
  rig.whole(r, Tier::kHost);
  rig.whole(u, Tier::kHost);
  rig.ready(u, Tier::kHbm, 1);
  const PlacementPlan plan = rig.plan_room(Tier::kHost, 2, /*host_free=*/0, /*nvme_free=*/0);
  for (const PlannedMove& m : plan.moves) {
    EXPECT_NE(m.from, Tier::kNvme)
        << "a block in use lost its only copy, " << to_string(m.block.key);
  }
  const PlannedMove* u_out = move_of(plan, 205, Tier::kHost);
  ASSERT_NE(u_out, nullptr);
  EXPECT_EQ(u_out->to, std::nullopt);
  EXPECT_EQ(u_out->frames_freed, 1u) << "only its page HBM holds may leave";
  EXPECT_EQ(plan.shortfall, 1u);
}

// A block whose host page leaves in a plan needs, to be demoted from HBM in the same plan, a host
// frame for every page, not only for those host memory did not hold. HBM (2 layers, 4 frames)
// holds cached blocks A and B, oldest first; host memory (3 frames, no NVMe) holds B's layer 0
// (shadowed: HBM holds it too) and cached block C, oldest first. Room for all of HBM: A goes down,
// for which host memory drops B's page and C. B would then need both frames host memory has no
// more of (one is left): it stays, and it cannot be dropped either, as the drop of its host page
// relies on its HBM copy. The plan says it is 2 frames short.
TEST(PlacementTwoTiers, ABlockWhoseHostPageLeavesInThePlanNeedsAHostFrameForEveryPage) {
  TwoLayerRig rig(KeptKind::kInUseWithoutNvme, /*hbm_frames=*/4, /*host_frames=*/3);
  const BlockKey a = rig.cached(1);
  const BlockKey b = rig.cached(2);
  const BlockKey c = rig.cached(3);
  for (const BlockKey& key : {a, b}) rig.whole(key, Tier::kHbm);
  rig.one_page(b, Tier::kHost, 0);
  rig.whole(c, Tier::kHost);
  const PlacementPlan plan = rig.plan_room(Tier::kHbm, 4);
  const PlannedMove* a_down = move_of(plan, 1, Tier::kHbm);
  ASSERT_NE(a_down, nullptr);
  EXPECT_EQ(a_down->to, Tier::kHost);
  EXPECT_EQ(a_down->frames_taken, 2u);
  ASSERT_NE(move_of(plan, 2, Tier::kHost), nullptr) << "B's host page made room for A";
  ASSERT_NE(move_of(plan, 3, Tier::kHost), nullptr) << "so did C";
  EXPECT_EQ(move_of(plan, 2, Tier::kHbm), nullptr)
      << "B would take one host frame for two pages, or be lost from both tiers";
  EXPECT_EQ(plan.shortfall, 2u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PlacementKept,
                         ::testing::Values(KeptKind::kPrivate, KeptKind::kInUseWithoutNvme),
                         [](const ::testing::TestParamInfo<KeptKind>& info) {
                           return std::string(
                               info.param == KeptKind::kPrivate ? "Private" : "InUseWithoutNvme");
                         });

}  // namespace
}  // namespace kvtier
