// The lookahead policy's parts that remember and learn: the reuse model's expected gap per class
// (survival estimate over censored intervals, fallbacks, pools, decay, age buckets) and the ghost
// table and history that keep a block's references after it leaves.
#include "scheduler/policies/reuse_model.hpp"

#include <gtest/gtest.h>

#include "scheduler/policies/ghost_history.hpp"
#include "scheduler/policies/ghost_table.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

TEST(ReuseModel, UnseenClassesRankAsNeverBack) {
  ReuseModel m(3, 64, 1000, {ReuseModel::kNoFallback, 0, 1});
  m.advance(10);
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_EQ(m.expected_gap(c), 64.0);
    EXPECT_EQ(m.reuse_probability(c), 0.0);
  }
}

// A horizon of 64 events: buckets of one event, so ages are exact.
TEST(ReuseModel, WithEveryIntervalSettledItIsTheTruncatedMean) {
  ReuseModel m(1, 64, 100000);
  for (int i = 0; i < 4; ++i) m.entered(0);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(0, 10);
  EXPECT_EQ(m.expected_gap(0), 64.0);  // gaps change at the next bucket boundary
  m.advance(100);                      // the fourth is past the horizon
  // Three gaps of 10 and one "not within H", against one pseudo-interval that never closes.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 3.0 / 5);
  // A reuse past the horizon is none.
  m.reused(0, 95);
  m.advance(101);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
}

TEST(ReuseModel, OpenIntervalsCountOnlyForTheAgesTheyReached) {
  ReuseModel m(1, 64, 100000);
  m.entered(0);
  m.entered(0);
  m.advance(30);
  m.reused(0, 30);  // one of the two is back at age 30
  m.advance(31);
  for (int i = 0; i < 10; ++i) m.entered(0);
  m.advance(40);
  // The ten young intervals have not reached age 30: one in three came back there (the pseudo-
  // interval is the third). Counted as "not within H" from the start, they would make it
  // (30 + 12 x 64) / 13.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 30.0 / 3 + 64 * 2.0 / 3);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 1.0 / 3);
}

TEST(ReuseModel, AClassWithLittleEvidenceFollowsItsFallback) {
  ReuseModel m(2, 64, 100000, {ReuseModel::kNoFallback, 0});
  for (int i = 0; i < 3; ++i) m.entered(0);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(0, 10);
  m.advance(11);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 0.75 * 10 + 0.25 * 64);
  // Class 1's pseudo-interval closes at class 0's hazard, at the middle of the bucket.
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.75 * 10.5 + 0.25 * 64);
  // Its own evidence outweighs the fallback: twenty intervals, none back by age 20.
  for (int i = 0; i < 20; ++i) m.entered(1);
  m.advance(31);
  EXPECT_GT(m.expected_gap(1), 60.0);
}

// Class 0 pools classes 1 and 2: its estimate counts their intervals (and its own), while each
// keeps an estimate of its own evidence.
TEST(ReuseModel, APoolCountsTheIntervalsOfItsMembers) {
  ReuseModel m(3, 64, 100000, {}, {ReuseModel::kNoFallback, 0, 0});
  for (int i = 0; i < 3; ++i) m.entered(1);
  m.entered(2);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(1, 10);
  m.advance(100);  // class 2's interval is past the horizon
  // Class 1: three gaps of 10 and its pseudo-interval; class 2: nothing back.
  EXPECT_DOUBLE_EQ(m.expected_gap(1), (30.0 + 64) / 4);
  EXPECT_DOUBLE_EQ(m.expected_gap(2), 64.0);
  // Class 0: the four intervals of its members and its own pseudo-interval.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 3.0 / 5);
  // A pool into a class that is pooled itself, or into itself, is ignored.
  ReuseModel chained(3, 64, 100000, {}, {1, 2, 2});
  chained.entered(0);
  chained.advance(10);
  chained.reused(0, 10);
  chained.advance(11);
  EXPECT_DOUBLE_EQ(chained.expected_gap(0), (10.0 + 64) / 2);
  EXPECT_DOUBLE_EQ(chained.expected_gap(1), 64.0);
}

TEST(ReuseModel, MovedIntervalsTakeTheAgesTheyReached) {
  ReuseModel m(2, 64, 100000);
  m.entered(0);
  m.entered(0);
  m.advance(5);
  m.moved(0, 1, 0);  // one of them is class 1's, at risk for ages 0-5 there
  m.advance(10);
  m.reused(1, 10);
  m.reused(0, 3);  // nothing of class 0 opened at 7: ignored
  m.advance(11);
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.5 * 10 + 0.5 * 64);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 64.0);
  m.moved(1, 0, 0);  // closed already: nothing to move
  m.moved(0, 1, 3);  // nothing opened at 3
  m.advance(12);
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.5 * 10 + 0.5 * 64);

  // An interval moved once past the horizon brings "open at every age".
  ReuseModel s(2, 64, 100000);
  s.entered(0);
  s.entered(1);
  s.advance(10);
  s.reused(1, 10);
  s.advance(100);
  EXPECT_DOUBLE_EQ(s.expected_gap(1), 0.5 * 10 + 0.5 * 64);
  s.moved(0, 1, 0);
  s.advance(101);
  EXPECT_DOUBLE_EQ(s.expected_gap(1), 10.0 / 3 + 64 * 2.0 / 3);
}

TEST(ReuseModel, DecayHalvesOldEvidence) {
  ReuseModel d(1, 64, 1000);
  for (int i = 0; i < 4; ++i) d.entered(0);
  d.advance(10);
  for (int i = 0; i < 4; ++i) d.reused(0, 10);
  d.advance(11);
  EXPECT_DOUBLE_EQ(d.expected_gap(0), 0.8 * 10 + 0.2 * 64);  // 4 back of 4, with the prior
  d.advance(1000);  // a half-life: 2 of 2 against the prior
  EXPECT_DOUBLE_EQ(d.expected_gap(0), 10.0 * 2 / 3 + 64.0 / 3);
}

TEST(ReuseModel, AgesAreCutIntoBucketsOfTheHorizon) {
  ReuseModel m(1, 1000, 100000);
  EXPECT_EQ(m.bucket_events(), 16u);
  EXPECT_EQ(m.horizon(), 1008u);  // 63 buckets of 16 events
  m.entered(0);
  m.advance(5);
  m.reused(0, 5);
  EXPECT_EQ(m.expected_gap(0), 1008.0);
  m.advance(16);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 0.5 * 5 + 0.5 * 1008);
}

TEST(GhostTable, EntriesCarryTimeCountAndTag) {
  GhostTable g(64);
  EXPECT_EQ(g.capacity(), 64u);
  EXPECT_FALSE(g.find(key_of(1), 10).has_value());
  g.put(key_of(1), GhostTable::Entry{7, 3, 5}, 10);
  auto e = g.find(key_of(1), 10);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->time, 7u);
  EXPECT_EQ(e->count, 3u);
  EXPECT_EQ(e->tag, 5u);
  EXPECT_TRUE(g.set_tag(key_of(1), 6));
  EXPECT_FALSE(g.set_tag(key_of(2), 6));
  g.put(key_of(1), GhostTable::Entry{12, 100000, 6}, 12);  // replaces; the count saturates
  EXPECT_EQ(g.size(), 1u);
  e = g.take(key_of(1), 20);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->time, 12u);
  EXPECT_EQ(e->count, GhostTable::kMaxCount);
  EXPECT_EQ(e->tag, 6u);
  EXPECT_FALSE(g.find(key_of(1), 20).has_value());
  EXPECT_EQ(g.size(), 0u);
  // Times are kept modulo 2^40 and rebuilt against the owner's clock.
  const uint64_t late = (uint64_t{1} << 41) + 5;
  g.put(key_of(2), GhostTable::Entry{late - 3, 1, 0}, late);
  EXPECT_EQ(g.find(key_of(2), late)->time, late - 3);
  GhostTable none(0);
  none.put(key_of(1), GhostTable::Entry{1, 1, 0}, 1);
  EXPECT_FALSE(none.find(key_of(1), 1).has_value());
}

TEST(GhostTable, AFullBucketOfEqualCountsForgetsTheEntryReferencedLongestAgo) {
  GhostTable g(GhostTable::kWays);  // one bucket
  for (uint64_t id = 1; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{100 + id, 1, 0}, 100 + id);
  }
  g.put(key_of(1), GhostTable::Entry{200, 2, 0}, 200);  // 1 referenced again: now the newest
  g.put(key_of(99), GhostTable::Entry{201, 1, 0}, 201);
  EXPECT_TRUE(g.find(key_of(1), 201).has_value());
  EXPECT_FALSE(g.find(key_of(2), 201).has_value());  // the oldest reference
  EXPECT_TRUE(g.find(key_of(99), 201).has_value());
  EXPECT_EQ(g.size(), GhostTable::kWays);
  // A block evicted with an old last reference is the next to go.
  g.put(key_of(3), GhostTable::Entry{50, 1, 0}, 202);
  g.put(key_of(98), GhostTable::Entry{203, 1, 0}, 203);
  EXPECT_FALSE(g.find(key_of(3), 203).has_value());
  EXPECT_TRUE(g.find(key_of(4), 203).has_value());
}

TEST(GhostTable, AFullBucketKeepsAnEntryLongerPerReferenceItHad) {
  GhostTable g(GhostTable::kWays);  // one bucket
  // Block 1, referenced 4 times, last at 100; blocks 2..8 once each, later.
  g.put(key_of(1), GhostTable::Entry{100, 4, 0}, 100);
  for (uint64_t id = 2; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{200 + id, 1, 0}, 200 + id);
  }
  // At 300: block 1 is 200 old over 4 references (50 each), block 2 is 98 old over 1.
  g.put(key_of(99), GhostTable::Entry{300, 1, 0}, 300);
  EXPECT_TRUE(g.find(key_of(1), 300).has_value());
  EXPECT_FALSE(g.find(key_of(2), 300).has_value());
  // At 700: block 1 is 600 / 4 = 150 per reference; block 3 is 497, the stalest once-used one.
  g.put(key_of(98), GhostTable::Entry{700, 1, 0}, 700);
  EXPECT_TRUE(g.find(key_of(1), 700).has_value());
  EXPECT_FALSE(g.find(key_of(3), 700).has_value());
  // It still goes when it is the stalest per reference: the others referenced again at 2000.
  for (uint64_t id = 4; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{2000, 8, 0}, 2000);
  }
  g.put(key_of(99), GhostTable::Entry{2000, 8, 0}, 2000);
  g.put(key_of(98), GhostTable::Entry{2000, 8, 0}, 2000);
  // At 2001 block 1 has 1901 / 4 against 1 / 8 for each of the others.
  g.put(key_of(97), GhostTable::Entry{2001, 1, 0}, 2001);
  EXPECT_FALSE(g.find(key_of(1), 2001).has_value());
  EXPECT_EQ(g.size(), GhostTable::kWays);
}

TEST(GhostHistory, ASlotLeftByATakeNeverForgetsTheKeysNewerEntry) {
  GhostHistory g(3);
  g.put(key_of(1), 1);  // slot 0
  g.take(key_of(1));
  g.put(key_of(1), 2);  // slot 1
  g.put(key_of(2), 1);  // slot 2
  g.put(key_of(3), 1);  // reuses slot 0, which no longer owns 1
  EXPECT_EQ(g.count(key_of(1)), 2u);
  g.put(key_of(4), 1);  // reuses slot 1: now 1 goes
  EXPECT_FALSE(g.contains(key_of(1)));
  EXPECT_TRUE(g.contains(key_of(2)));
  EXPECT_TRUE(g.contains(key_of(3)));
  EXPECT_TRUE(g.contains(key_of(4)));
}

}  // namespace
}  // namespace kvtier::testing
