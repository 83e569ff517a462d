// What every eviction policy does at the edges: capacity 0 and 1, everything refused by the
// filter, re-insertion after erase and misuse counted, shadowed copies offered first over any
// policy; and plain LRU's order within a chain.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/policies/lfu_evictor.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/lru_evictor.hpp"
#include "scheduler/policies/prefix_aware_evictor.hpp"
#include "scheduler/policies/s3fifo_evictor.hpp"
#include "scheduler/policies/shadowed_first.hpp"
#include "scheduler/policies/write_strategy.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

TEST(Evictors, CapacityZeroHoldsNothing) {
  const auto trace = singles({1, 2, 1, 2});
  EXPECT_EQ(run_policy<LruEvictor>(0, trace), 0u);
  EXPECT_EQ(run_policy<S3FifoEvictor>(0, trace), 0u);
  EXPECT_EQ(run_policy<LookaheadEvictor>(0, trace), 0u);
}

TEST(Evictors, CapacityOneKeepsTheLastBlock) {
  const auto trace = singles({1, 1, 2, 2, 1});
  EXPECT_EQ(run_policy<LruEvictor>(1, trace), 2u);
  EXPECT_EQ(run_policy<LfuEvictor>(1, trace), 2u);
  EXPECT_EQ(run_policy<PrefixAwareEvictor>(1, trace), 2u);
}

TEST(Evictors, EverythingRefusedByTheFilterYieldsNoVictim) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    EvictorOptions o;
    o.capacity_blocks = 4;
    auto e = make_evictor(p, o);
    for (uint64_t id = 1; id <= 4; ++id) e->on_insert(facts_of(id));
    std::vector<BlockKey> out;
    const auto pinned = [](const BlockKey&) { return true; };
    EXPECT_EQ(e->select_victims(3, KeyFilter(pinned), out), 0u) << eviction_policy_name(p);
    EXPECT_TRUE(out.empty());
    // Once one is free again, it is the only one offered.
    const auto only_three = [](const BlockKey& k) { return k.lo != 3; };
    EXPECT_EQ(e->select_victims(3, KeyFilter(only_three), out), 1u) << eviction_policy_name(p);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0], key_of(3));
    EXPECT_EQ(e->misuse(), 0u);
  }
}

TEST(Evictors, ReinsertionAfterEraseAndMisuseIsCounted) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    EvictorOptions o;
    o.capacity_blocks = 8;
    auto e = make_evictor(p, o);
    e->on_insert(facts_of(1));
    e->on_erase(key_of(1));
    EXPECT_FALSE(e->contains(key_of(1)));
    e->on_insert(facts_of(1));
    EXPECT_TRUE(e->contains(key_of(1)));
    EXPECT_EQ(e->size(), 1u);
    EXPECT_EQ(e->misuse(), 0u) << eviction_policy_name(p);
    e->on_insert(facts_of(1));  // already tracked
    e->on_access(key_of(9));    // never tracked
    e->on_erase(key_of(9));
    EXPECT_EQ(e->misuse(), 3u) << eviction_policy_name(p);
    EXPECT_EQ(e->size(), 1u);
  }
}

// Shadowed copies (a faster tier holds the block in full) go first, the longest-shadowed first,
// ahead of whatever the inner policy ranks first, each once; the rest comes from the inner policy
// in its order. Unshadowing or erasing a block takes it off the list; a newcomer is admitted while
// a shadowed copy can make room; marking an untracked key is misuse.
TEST(Evictors, ShadowedCopiesGoFirstOverAnyPolicy) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    SCOPED_TRACE(std::string(eviction_policy_name(p)));
    EvictorOptions o;
    o.capacity_blocks = 6;
    ShadowedFirstEvictor e(make_evictor(p, o));
    auto twin = make_evictor(p, o);  // the inner policy alone, told the same
    for (Evictor* x : {static_cast<Evictor*>(&e), twin.get()}) {
      for (uint64_t id = 1; id <= 6; ++id) x->on_insert(facts_of(id));
      for (uint64_t id : {1, 2, 3}) x->on_access(key_of(id));
    }
    std::vector<BlockKey> inner_order;
    twin->select_victims(6, KeyFilter::none(), inner_order);
    e.on_shadowed(key_of(5), true);
    e.on_shadowed(key_of(2), true);
    e.on_shadowed(key_of(5), true);  // again: no change
    e.on_shadowed(key_of(6), true);
    e.on_shadowed(key_of(6), false);
    EXPECT_EQ(e.shadowed(), 2u);
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
    EXPECT_EQ(out[0], key_of(5));
    EXPECT_EQ(out[1], key_of(2));
    std::vector<BlockKey> rest;
    for (const BlockKey& k : inner_order) {
      if (k != key_of(5) && k != key_of(2)) rest.push_back(k);
    }
    EXPECT_EQ(std::vector<BlockKey>(out.begin() + 2, out.end()), rest);
    // A refused shadowed block is passed over, and not offered by the inner policy either.
    out.clear();
    const auto refuse_five = [](const BlockKey& k) { return k == key_of(5); };
    ASSERT_EQ(e.select_victims(2, KeyFilter(refuse_five), out), 2u);
    EXPECT_EQ(out[0], key_of(2));
    EXPECT_NE(out[1], key_of(5));
    EXPECT_TRUE(e.admit(facts_of(99)));
    e.on_erase(key_of(5));
    e.on_erase(key_of(2));
    EXPECT_EQ(e.shadowed(), 0u);
    EXPECT_EQ(e.size(), 4u);
    e.on_shadowed(key_of(42), true);  // not tracked
    EXPECT_EQ(e.misuse(), 1u);
    EXPECT_EQ(e.shadowed(), 0u);
  }
  // Where the write strategy keeps copies below on purpose, nothing is wrapped.
  EvictorOptions o;
  auto lru = make_evictor(EvictionPolicy::kLru, o);
  Evictor* raw = lru.get();
  const auto write_through = make_write_strategy(WritePolicy::kWriteThrough, 2);
  EXPECT_EQ(shadowed_first(std::move(lru), Tier::kNvme, *write_through).get(), raw);
}

TEST(Evictors, PlainLruEvictsAChainHeadFirst) {
  EvictorOptions o;
  LruEvictor e(o);
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2, 1, 1));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));
}

}  // namespace
}  // namespace kvtier::testing
