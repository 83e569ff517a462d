// The lookahead policy's behaviour beyond its reference's hit counts: hinted blocks and
// returning ones kept, the horizon per tier, tiers sharing the last tier's history, output
// classes carried down the tiers, blocks in use ranked again when released, parents after their
// children, demoted chains leaving from their tails.
#include "scheduler/policies/lookahead_evictor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "scheduler/policies/ghost_table.hpp"
#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/reuse_model.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

TEST(Evictors, LookaheadKeepsHintedBlocksAndReturningOnes) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 100;  // horizon: 800 references, 806 in whole buckets of 13
  o.hints = &board;
  LookaheadEvictor e(o);
  // Block 5 comes back every second reference; the one-off blocks between never do.
  e.on_miss(facts_of(5));
  e.on_insert(facts_of(5));
  for (uint64_t i = 0; i < 40; ++i) {
    e.on_miss(facts_of(1000 + i));
    e.on_access(key_of(5));
  }
  EXPECT_EQ(e.uses_of(key_of(5)), 41u);
  EXPECT_EQ(e.uses_of(key_of(1000)), 1u);
  // Every reference here ends its one-block request (settled by the next one). The gaps are as
  // of the last bucket boundary, the 78th reference. Once-used by then: 39 intervals, one closed
  // (5's first) after 2 references, in the first age bucket; none of the others is back.
  EXPECT_DOUBLE_EQ(e.model().expected_gap(LookaheadEvictor::class_of(1, true)),
                   2.0 / 40 + 806.0 * 39 / 40);
  // 5 at 16+ uses: 23 intervals closed after 2 references, one open; its prior is 8-15's hazard.
  const double frequent = e.model().expected_gap(LookaheadEvictor::class_of(41, true));
  EXPECT_GT(frequent, 2.0);
  EXPECT_LT(frequent, 2.0 + 806.0 / 20);
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));  // the older newcomer; 5 is expected back far sooner
  const BlockKey hinted = key_of(1);
  ASSERT_TRUE(board.add(7, 0, std::span(&hinted, 1)).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(2));  // 1 is wanted by a waiting request
  // A hinted newcomer is always admitted; an unhinted new block is not worth 5's frame.
  EXPECT_TRUE(e.admit(facts_of(1)));
  e.on_erase(key_of(1));
  e.on_erase(key_of(2));
  e.on_miss(facts_of(2000));
  EXPECT_FALSE(e.admit(facts_of(2000)));
}

// When only hinted blocks can go, many victims at once are found in one walk of the hinted list:
// the filter is asked about each block once, and each pick is the block whose reader starts last
// among the kHintedScan oldest not taken yet (the first ones are refused).
TEST(Evictors, LookaheadManyHintedVictimsInOneWalk) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 4096;
  o.hints = &board;
  LookaheadEvictor e(o);
  constexpr uint64_t kBlocks = 2048;
  std::vector<BlockKey> keys;
  for (uint64_t id = 1; id <= kBlocks; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
    keys.push_back(key_of(id));
  }
  // Request r (expected to start at r) reads blocks 2r-1 and 2r: older blocks are read later
  // by requests numbered from the far end.
  for (uint64_t r = 1; r <= kBlocks / 2; ++r) {
    const BlockKey pair[2] = {key_of(kBlocks + 1 - 2 * r), key_of(kBlocks + 2 - 2 * r)};
    ASSERT_TRUE(board.add(r, r, pair).ok());
  }
  uint64_t asked = 0;
  const auto skip = [&](const BlockKey& k) {
    ++asked;
    return k == key_of(1) || k == key_of(2);
  };
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(kBlocks, KeyFilter(skip), out), kBlocks - 2);
  EXPECT_LE(asked, 2 * kBlocks) << "the hinted list was walked again for every victim";
  std::set<BlockKey> distinct(out.begin(), out.end());
  EXPECT_EQ(distinct.size(), out.size());
  EXPECT_EQ(distinct.count(key_of(1)) + distinct.count(key_of(2)), 0u);
  // Blocks 3 and 4 are read by the request that starts last of all the oldest ones.
  EXPECT_TRUE(out[0] == key_of(3) || out[0] == key_of(4)) << to_string(out[0]);
}

// What the last tier evicts leaves the cache: it measures its horizon in the whole cache. What a
// tier above evicts moves down and stays cached: it measures its horizon in its own frames.
TEST(Evictors, LookaheadMeasuresTheLastTiersHorizonInTheWholeCacheAndAnUpperTiersInItself) {
  EvictorOptions o;
  o.capacity_blocks = 16;
  EXPECT_EQ(LookaheadEvictor(o).model().horizon(), 8u * 16);
  o.cache_blocks = 4;  // never less than the tier itself
  EXPECT_EQ(LookaheadEvictor(o).model().horizon(), 8u * 16);
  std::array<std::optional<EvictorOptions>, 3> tiers;
  for (uint64_t t = 0; t < 3; ++t) {
    tiers[t].emplace().capacity_blocks = uint64_t{16} << (2 * t);  // 16, 64, 256 frames
    tiers[t]->cache_blocks = 336;
  }
  const auto cache = make_tier_evictors(EvictionPolicy::kLookahead, tiers);
  const auto horizon = [&](int t) {
    return static_cast<const LookaheadEvictor&>(*cache[t]).model().horizon();
  };
  EXPECT_EQ(horizon(0), 8u * 16);
  EXPECT_EQ(horizon(1), 8u * 64);
  EXPECT_EQ(horizon(2), 8u * 336);
  EXPECT_EQ(LookaheadEvictor(*tiers[0]).model().horizon(), 8u * 336);  // HBM as the last tier
}

// A toy hierarchy of three evictors, driven as the replay drives its tiers: every reference goes
// to every tier in order (an access where it holds the block, else a miss); a block missing from
// HBM is placed there, and each tier's victims go down to the next with their rank, the last
// tier's out of the cache; then the request ends. Returns, per request, the victims and every
// tier's use count and class of every key, so two hierarchies can be compared decision for
// decision.
std::vector<std::vector<uint64_t>> drive_hierarchy(std::array<std::unique_ptr<Evictor>, 3>& tiers,
                                                   const std::array<uint64_t, 3>& capacity,
                                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> log;
  std::function<void(std::size_t, const BlockFacts&)> place = [&](std::size_t t,
                                                                  const BlockFacts& block) {
    Evictor& e = *tiers[t];
    if (e.contains(block.key)) return;
    if (e.size() >= capacity[t]) {
      std::vector<BlockKey> victims;
      const auto keep = [&](const BlockKey& k) { return k == block.key; };
      ASSERT_EQ(e.select_victims(1, KeyFilter(keep), victims), 1u);
      // Ids are root * 10 + depth: a block's parent is the id before it, unless it is a root.
      const uint64_t id = victims[0].lo;
      BlockFacts down = id % 10 == 0 ? facts_of(id) : facts_of(id, id - 1, id % 10);
      e.describe(victims[0], down);
      down.demoted = true;
      log.back().push_back(victims[0].lo + 1000 * t);
      e.on_erase(victims[0]);
      if (t + 1 < tiers.size()) place(t + 1, down);
    }
    e.on_insert(block);
  };
  for (int request = 0; request < 3000; ++request) {
    log.emplace_back();
    // A chain of 1-6 blocks under one of 40 roots; ids root * 10 + depth.
    const uint64_t root = std::uniform_int_distribution<uint64_t>(1, 40)(rng);
    const uint32_t length = std::uniform_int_distribution<uint32_t>(1, 6)(rng);
    for (uint32_t depth = 0; depth < length; ++depth) {
      const uint64_t id = root * 10 + depth;
      const BlockFacts f = depth == 0 ? facts_of(id) : facts_of(id, id - 1, depth);
      for (auto& e : tiers) {
        if (e->contains(f.key)) {
          e->on_access(f.key);
        } else {
          e->on_miss(f);
        }
      }
      place(0, f);
    }
    // The request ends, having generated 0-400 tokens: its first uses take that output's class.
    std::vector<BlockKey> keys;
    for (uint32_t depth = 0; depth < length; ++depth) keys.push_back(key_of(root * 10 + depth));
    const uint64_t output = std::uniform_int_distribution<uint64_t>(0, 400)(rng);
    for (auto& e : tiers) e->on_request_end(keys, output);
    for (auto& e : tiers) {
      const auto& la = static_cast<const LookaheadEvictor&>(*e);
      for (uint64_t id = 10; id < 410; ++id) {
        const std::optional<GhostTable::Entry> known = la.recall(key_of(id));
        log.back().push_back(known ? known->count : 0);
        log.back().push_back(known ? known->tag : 0xff);
      }
    }
  }
  return log;
}

// The tiers of one cache share the last tier's history of blocks they do not hold instead of
// keeping a ghost each: the hierarchy decides exactly as three tiers with their own ghosts do,
// with one ghost in all.
TEST(Evictors, LookaheadTiersReadTheLastTiersHistoryAndDecideAsWithGhostsOfTheirOwn) {
  const std::array<uint64_t, 3> capacity = {6, 12, 30};
  std::array<std::optional<EvictorOptions>, 3> options;
  for (std::size_t t = 0; t < 3; ++t) {
    options[t].emplace();
    options[t]->capacity_blocks = capacity[t];
    options[t]->cache_blocks = 48;
  }
  for (uint64_t seed : {1, 2, 3}) {
    std::array<std::unique_ptr<Evictor>, 3> shared =
        make_tier_evictors(EvictionPolicy::kLookahead, options);
    // Each with its own ghost; a tier above the last measures its horizon in its own frames.
    std::array<std::unique_ptr<Evictor>, 3> own;
    for (std::size_t t = 0; t < 3; ++t) {
      EvictorOptions alone = *options[t];
      if (t < 2) alone.cache_blocks = 0;
      own[t] = make_evictor(EvictionPolicy::kLookahead, alone);
    }
    EXPECT_EQ(drive_hierarchy(shared, capacity, seed), drive_hierarchy(own, capacity, seed));
    for (std::size_t t = 0; t < 3; ++t) {
      EXPECT_EQ(shared[t]->misuse(), 0u);
      const auto& a = static_cast<const LookaheadEvictor&>(*shared[t]).model();
      const auto& b = static_cast<const LookaheadEvictor&>(*own[t]).model();
      for (uint32_t c = 0; c < LookaheadEvictor::kClasses; ++c) {
        EXPECT_EQ(a.expected_gap(c), b.expected_gap(c)) << "tier " << t << " class " << c;
      }
    }
    // The upper tiers hold no ghost (the smallest one has 65,536 entries of 16 bytes).
    for (std::size_t t = 0; t < 2; ++t) {
      EXPECT_LE(shared[t]->memory_bytes() + (1u << 20), own[t]->memory_bytes()) << "tier " << t;
    }
    EXPECT_EQ(shared[2]->memory_bytes(), own[2]->memory_bytes());
  }
  // A tier alone, or the policies without such a history, are what make_evictor builds.
  std::array<std::optional<EvictorOptions>, 3> hbm_only;
  hbm_only[0] = options[0];
  const auto alone = make_tier_evictors(EvictionPolicy::kLookahead, hbm_only);
  EXPECT_EQ(alone[0]->memory_bytes(),
            make_evictor(EvictionPolicy::kLookahead, *options[0])->memory_bytes());
  EXPECT_EQ(alone[1], nullptr);
  EXPECT_EQ(alone[2], nullptr);
  const auto lru = make_tier_evictors(EvictionPolicy::kLru, options);
  for (const auto& e : lru) EXPECT_EQ(e->name(), "lru");
}

// A request's end classes its first uses by what it generated, in every tier: a block HBM tracks,
// the last tier's memory of it, and the block once demoted (it keeps that class, not the one of a
// first use whose request is still open).
TEST(Evictors, LookaheadFirstUsesKeepTheirRequestsOutputClassDownTheTiers) {
  std::array<std::optional<EvictorOptions>, 3> options;
  options[0].emplace().capacity_blocks = 2;
  options[2].emplace().capacity_blocks = 8;
  options[0]->cache_blocks = options[2]->cache_blocks = 10;
  auto tiers = make_tier_evictors(EvictionPolicy::kLookahead, options);
  const auto& hbm = static_cast<const LookaheadEvictor&>(*tiers[0]);
  const auto& nvme = static_cast<const LookaheadEvictor&>(*tiers[2]);
  const uint32_t open = LookaheadEvictor::class_of(1, false);
  const uint32_t long_answer = LookaheadEvictor::first_use_class(300, false);
  ASSERT_NE(open, long_answer);
  EXPECT_EQ(LookaheadEvictor::first_use_class(15, false),
            LookaheadEvictor::first_use_class(0, false));
  EXPECT_NE(LookaheadEvictor::first_use_class(16, false),
            LookaheadEvictor::first_use_class(15, false));
  for (std::size_t t : {0, 2}) tiers[t]->on_miss(facts_of(1));
  tiers[0]->on_insert(facts_of(1));
  EXPECT_EQ(hbm.recall(key_of(1))->tag, open);
  const std::vector<BlockKey> keys = {key_of(1)};
  for (std::size_t t : {0, 2}) tiers[t]->on_request_end(keys, 300);
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);
  EXPECT_EQ(nvme.recall(key_of(1))->tag, long_answer);
  for (std::size_t t : {0, 2}) tiers[t]->on_request_end(keys, 3);  // once per request: kept
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);
  BlockFacts down = facts_of(1);
  tiers[0]->describe(key_of(1), down);
  down.demoted = true;
  tiers[0]->on_erase(key_of(1));
  tiers[2]->on_insert(down);
  EXPECT_EQ(nvme.recall(key_of(1))->tag, long_answer);
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);  // read from the last tier
  EXPECT_EQ(hbm.misuse() + nvme.misuse(), 0u);
}

// A tier whose clock fell behind the last tier's (a caller that skipped it for some references)
// never reads a reference from its future: a block's last reference is at most its own clock.
TEST(Evictors, LookaheadTierBehindItsHistoryReadsNoFutureReference) {
  std::array<std::optional<EvictorOptions>, 3> options;
  options[0].emplace().capacity_blocks = 4;
  options[2].emplace().capacity_blocks = 4;
  auto tiers = make_tier_evictors(EvictionPolicy::kLookahead, options);
  EXPECT_EQ(tiers[1], nullptr);
  for (int i = 0; i < 5; ++i) tiers[2]->on_miss(facts_of(100 + i));  // HBM skipped
  tiers[2]->on_miss(facts_of(1));                                    // the last tier at 6
  tiers[0]->on_miss(facts_of(1));                                    // HBM at 1
  tiers[2]->on_miss(facts_of(1));
  const auto& hbm = static_cast<const LookaheadEvictor&>(*tiers[0]);
  const std::optional<GhostTable::Entry> seen = hbm.recall(key_of(1));
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->time, 1u);
  EXPECT_EQ(seen->count, 2u);
  tiers[0]->on_insert(facts_of(1));
  EXPECT_EQ(hbm.recall(key_of(1))->time, 1u);
  EXPECT_EQ(hbm.misuse(), 0u);
}

// A block an open sequence holds (EvictorOptions::in_use) is wanted now: it goes after every
// block no one is known to read, and after those a waiting request reads; when its sequence
// closes it ranks again as if touched then.
TEST(Evictors, LookaheadKeepsBlocksInUseLongestAndRanksThemAgainWhenReleased) {
  HintBoard board;
  std::set<uint64_t> held;
  EvictorOptions o;
  o.capacity_blocks = 4;
  o.hints = &board;
  o.in_use = [&](const BlockKey& k) { return held.count(k.lo) != 0; };
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 4; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
  }
  held = {1, 2};  // the two oldest: an open sequence's
  const std::vector<BlockKey> queued = {key_of(3)};
  ASSERT_TRUE(board.add(7, 1000, queued).ok());
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out[0], key_of(4));  // read by no one known
  EXPECT_EQ(out[1], key_of(3));  // read by a waiting request
  EXPECT_TRUE((out[2] == key_of(1) && out[3] == key_of(2)) ||
              (out[2] == key_of(2) && out[3] == key_of(1)));
  // The sequence closes and the request starts: 1, 2 and 3 rank again as if touched now, so the
  // oldest, 1, is no longer first; 4 is.
  held.clear();
  ASSERT_TRUE(board.remove(7).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(4));
  EXPECT_EQ(e.misuse(), 0u);
}

// A block whose sequence closed ranks again when the scheduler says so (on_released), not only
// once it reaches the back of the hinted list, where a longer-lived sequence's blocks wait (and
// where the last-resort scan, kHintedScan blocks deep, never reaches it).
TEST(Evictors, LookaheadRanksAReleasedBlockAgainWhereverItWaits) {
  std::set<uint64_t> held;
  EvictorOptions o;
  o.capacity_blocks = 40;
  o.in_use = [&](const BlockKey& k) { return held.count(k.lo) != 0; };
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 40; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
    if (id <= 30) held.insert(id);  // 1-20: a long decode; 21-30: sequences that close soon
  }
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(31));  // 1-30 wait in the hinted list, 1 at its back
  for (uint64_t id = 21; id <= 30; ++id) {
    held.erase(id);
    e.on_released(key_of(id));
  }
  e.on_released(key_of(1));  // still held: stays where it is
  out.clear();
  ASSERT_EQ(e.select_victims(20, KeyFilter::none(), out), 20u);
  std::set<uint64_t> ids;
  for (const BlockKey& k : out) ids.insert(k.lo);
  for (uint64_t id = 21; id <= 40; ++id) EXPECT_EQ(ids.count(id), 1u) << id;  // not 1-20
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadHintedBlocksLeaveTheRankingUntilTouchedOrUnhinted) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 3;
  o.hints = &board;
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 3; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
  }
  const std::vector<BlockKey> queued = {key_of(1), key_of(2), key_of(3)};
  ASSERT_TRUE(board.add(10, 0, queued).ok());
  // Everything held is wanted by the queue: an unhinted newcomer is refused, and victims are
  // offered only as a last resort, oldest first.
  e.on_miss(facts_of(4));
  EXPECT_FALSE(e.admit(facts_of(4)));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(2));
  // The request starts and touches 3 only; 1 and 2 are ranked again, as if touched now (1 first,
  // it waited longest). 3 ranks by its new class.
  ASSERT_TRUE(board.remove(10).ok());
  e.on_access(key_of(3));
  out.clear();
  ASSERT_EQ(e.select_victims(3, KeyFilter::none(), out), 3u);
  const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
  EXPECT_LT(at(1), at(2));
  EXPECT_NE(at(3), out.end());
  // With a waiting request for 3 again, 3 is kept while 1 and 2 can go; a hinted newcomer enters.
  const BlockKey three = key_of(3);
  ASSERT_TRUE(board.add(11, 0, std::span(&three, 1)).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(2));
  const BlockKey five = key_of(5);
  ASSERT_TRUE(board.add(12, 0, std::span(&five, 1)).ok());
  EXPECT_TRUE(e.admit(facts_of(5)));
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadLearnsWhichEndsOfRequestsComeBack) {
  // Requests [P, Q, L_i]: the shared prefix P, Q comes back every request, each final block L_i
  // never does. The policy learns it from the order of references alone.
  EvictorOptions o;
  o.capacity_blocks = 4;  // horizon: 32 references
  LookaheadEvictor e(o);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 60; ++i) reqs.push_back({1, 2, 100 + i});
  const DriveResult r = drive(e, 4, reqs);
  EXPECT_EQ(r.hits, 2u * 59);  // P and Q are never evicted for a final block
  const ReuseModel& m = e.model();
  EXPECT_EQ(m.reuse_probability(LookaheadEvictor::class_of(1, true)), 0.0);
  EXPECT_GT(m.reuse_probability(LookaheadEvictor::class_of(16, false)), 0.9);
  EXPECT_DOUBLE_EQ(m.expected_gap(LookaheadEvictor::class_of(1, true)), 32.0);
  EXPECT_LT(m.expected_gap(LookaheadEvictor::class_of(16, false)), 8.0);
  // The cache holds P, Q and the last two final blocks; the older one, settled as a request's
  // end, goes first.
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(158));
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadChildNeverRanksAboveItsParent) {
  EvictorOptions o;
  o.capacity_blocks = 16;
  LookaheadEvictor e(o);
  // Train: the chain X -> Y comes back every request, so X's continued classes learn a short gap.
  std::vector<Request> reqs(12, Request{50, 51});
  drive(e, 16, reqs);
  const uint32_t fresh = LookaheadEvictor::class_of(1, false);
  const uint32_t returning = LookaheadEvictor::class_of(6, false);
  ASSERT_LT(e.model().expected_gap(returning), e.model().expected_gap(fresh));
  // A new parent, and a child demoted with 5 past hits: the child's own class would rank above
  // the parent; it joins the parent's list, behind it.
  e.on_insert(facts_of(1));
  BlockFacts child = facts_of(2, 1, 1);
  child.hits = 5;
  e.on_insert(child);
  EXPECT_EQ(e.uses_of(key_of(2)), 6u);
  std::vector<BlockKey> out;
  const auto only_new = [](const BlockKey& k) { return k.lo != 1 && k.lo != 2; };
  ASSERT_EQ(e.select_victims(2, KeyFilter(only_new), out), 2u);
  EXPECT_EQ(out[0], key_of(2));
  EXPECT_EQ(out[1], key_of(1));
}

// Two lookahead tiers that hear every reference, as the scheduler's do: a block demoted with the
// upper tier's rank (describe()) ranks in the lower tier from that rank, so the tiers keep one
// order; without it, it would rank from its arrival, as fresh as a block referenced just now.
TEST(Evictors, LookaheadDemotedBlockKeepsTheRankOfTheTierAbove) {
  EvictorOptions o;
  o.capacity_blocks = 4;
  LookaheadEvictor upper(o);
  LookaheadEvictor lower(o);
  // References 1 and 2 (t = 1, 2) are held by the upper tier; 3 (t = 3) by the lower one.
  for (uint64_t id : {1, 2}) {
    upper.on_miss(facts_of(id));
    upper.on_insert(facts_of(id));
    lower.on_miss(facts_of(id));
  }
  upper.on_miss(facts_of(3));
  lower.on_miss(facts_of(3));
  lower.on_insert(facts_of(3));
  // 1 is demoted at t = 3: it brings its rank time 1, older than 3's.
  BlockFacts one = facts_of(1);
  upper.describe(key_of(1), one);
  ASSERT_TRUE(one.rank.has_value());
  EXPECT_EQ(one.rank->time, 1u);
  one.demoted = true;
  lower.on_insert(one);
  upper.on_erase(key_of(1));
  std::vector<BlockKey> out;
  ASSERT_EQ(lower.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(3));
  // Admission compares the carried rank too: 2 ranks from t = 2, after 1 and before 3.
  BlockFacts two = facts_of(2);
  upper.describe(key_of(2), two);
  two.demoted = true;
  EXPECT_TRUE(lower.admit(two));
  lower.on_erase(key_of(1));
  for (uint64_t id : {50, 51}) {  // the clock moves on to t = 5
    upper.on_miss(facts_of(id));
    lower.on_miss(facts_of(id));
  }
  EXPECT_FALSE(lower.admit(two));  // 3, the victim now, ranks above it
  // Not demoted (a promotion), the same facts rank from now: above 3.
  two.demoted = false;
  EXPECT_TRUE(lower.admit(two));
  EXPECT_EQ(upper.misuse() + lower.misuse(), 0u);
}

// Demoted blocks that arrive out of rank order are put in order; a chain demoted from its tail
// (child first, same rank time) keeps its parent ahead; a block referenced here since ranks last.
TEST(Evictors, LookaheadOrdersDemotedArrivalsByTheirRank) {
  EvictorOptions o;
  o.capacity_blocks = 8;
  LookaheadEvictor e(o);
  for (int i = 0; i < 20; ++i) e.on_miss(facts_of(1000 + i));  // the clock reaches 20
  e.on_miss(facts_of(9));
  e.on_insert(facts_of(9));  // referenced at t = 21
  const auto demote = [&](BlockFacts f, uint64_t time) {
    f.demoted = true;
    f.rank = CarriedRank{time, static_cast<uint8_t>(LookaheadEvictor::class_of(1, false))};
    e.on_insert(f);
  };
  demote(facts_of(5), 12);
  demote(facts_of(4), 7);
  demote(facts_of(6), 15);
  demote(facts_of(8, 7, 1), 10);  // the chain 7 -> 8, child first
  demote(facts_of(7), 10);
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
  const std::vector<BlockKey> expected = {key_of(4), key_of(8), key_of(7),
                                          key_of(5), key_of(6), key_of(9)};
  EXPECT_EQ(out, expected);
  EXPECT_EQ(e.misuse(), 0u);
}

// Chains demoted with one rank time (one run) leave from their tails however their blocks
// arrive: a tier above may send a head down first (it ran out of room while the chain was still
// being computed), a tail first, or two chains' blocks alternately. Arriving head first between
// other blocks, each block used to go in front of those before it, so the head left first and
// stranded its children.
TEST(Evictors, LookaheadDemotedChainLeavesFromItsTailInAnyArrivalOrder) {
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  // Chains 1 -> 2 -> 3 and 21 -> 22 -> 23, one run (rank time 5).
  const auto facts = [](uint64_t id) {
    const uint64_t depth = id % 20 - 1;
    return depth == 0 ? facts_of(id) : facts_of(id, id - 1, static_cast<uint32_t>(depth));
  };
  for (const std::vector<uint64_t>& order :
       {std::vector<uint64_t>{1, 21, 2, 22, 3, 23}, std::vector<uint64_t>{3, 23, 2, 22, 1, 21},
        std::vector<uint64_t>{2, 21, 3, 1, 23, 22}}) {
    EvictorOptions o;
    o.capacity_blocks = 8;
    LookaheadEvictor e(o);
    for (uint64_t id : order) {
      BlockFacts f = facts(id);
      f.demoted = true;
      f.rank = CarriedRank{5, cls};
      e.on_insert(f);
    }
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
    const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
    std::string arrival;
    for (uint64_t id : order) arrival += std::to_string(id) + " ";
    EXPECT_LT(at(3), at(2)) << "arrival order " << arrival;
    EXPECT_LT(at(2), at(1)) << "arrival order " << arrival;
    EXPECT_LT(at(23), at(22)) << "arrival order " << arrival;
    EXPECT_LT(at(22), at(21)) << "arrival order " << arrival;
    EXPECT_EQ(e.misuse(), 0u);
  }
}

// A parent goes after its children, whatever their ranks. Demoted with an older rank than its
// child's, in either order of arrival: met in the walk, it waits and goes right after its child;
// found at the ranking's tail, it is held out of the ranking (a child the caller refuses does not
// free it) until its last child leaves, and then ranks by its own rank time again.
TEST(Evictors, LookaheadParentGoesAfterItsChildrenWhateverTheirRanks) {
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  const auto demote = [&](LookaheadEvictor& e, BlockFacts f, uint64_t time) {
    f.demoted = true;
    f.rank = CarriedRank{time, cls};
    e.on_insert(f);
  };
  for (bool child_first : {true, false}) {
    const std::string order = child_first ? "child first" : "parent first";
    EvictorOptions o;
    o.capacity_blocks = 8;
    LookaheadEvictor e(o);
    for (int i = 0; i < 20; ++i) e.on_miss(facts_of(1000 + i));  // the clock reaches 20
    // Parent first, the child does not arrive right behind it (it would take the parent's time).
    if (child_first) demote(e, facts_of(2, 1, 1), 10);
    demote(e, facts_of(1), 5);
    demote(e, facts_of(7), 3);
    if (!child_first) demote(e, facts_of(2, 1, 1), 10);
    demote(e, facts_of(9), 12);
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
    const std::vector<BlockKey> expected = {key_of(7), key_of(2), key_of(1), key_of(9)};
    EXPECT_EQ(out, expected) << order;
    e.on_erase(key_of(7));
    const auto one = [&](KeyFilter skip) {
      std::vector<BlockKey> v;
      EXPECT_EQ(e.select_victims(1, skip, v), 1u) << order;
      return v.empty() ? BlockKey{} : v[0];
    };
    EXPECT_EQ(one(KeyFilter::none()), key_of(2)) << order;  // 1, at the tail now, is held
    const auto child_leaving = [](const BlockKey& k) { return k == key_of(2); };
    EXPECT_EQ(one(KeyFilter(child_leaving)), key_of(9)) << order;
    e.on_erase(key_of(2));
    EXPECT_EQ(one(KeyFilter::none()), key_of(1)) << order;  // ranked again, below 9
    EXPECT_EQ(e.misuse(), 0u);
  }
}

// A run of references (each the child of the one before) ranks from its first reference, also
// where this tier holds only part of it: a chain whose middle block is elsewhere keeps one rank
// time here, as it would in one cache of the tiers' summed size. describe() carries it on, with
// the block's depth.
TEST(Evictors, LookaheadARunRanksFromItsStartWhereThisTierHoldsPartOfIt) {
  EvictorOptions o;
  o.capacity_blocks = 8;
  LookaheadEvictor e(o);
  e.on_miss(facts_of(1));  // t = 1: the run starts
  e.on_insert(facts_of(1));
  e.on_miss(facts_of(2, 1, 1));  // t = 2: held by another tier
  e.on_miss(facts_of(3, 2, 2));  // t = 3
  e.on_insert(facts_of(3, 2, 2));
  e.on_miss(facts_of(10));  // t = 4: a new run
  e.on_insert(facts_of(10));
  BlockFacts three;  // as the placement fills it: key and parent
  three.key = key_of(3);
  three.parent = key_of(2);
  e.describe(key_of(3), three);
  ASSERT_TRUE(three.rank.has_value());
  EXPECT_EQ(three.rank->time, 1u);
  EXPECT_EQ(three.depth, 2u);
  BlockFacts ten = facts_of(10);
  e.describe(key_of(10), ten);
  ASSERT_TRUE(ten.rank.has_value());
  EXPECT_EQ(ten.rank->time, 4u);
  // Read again, 1 starts a run at t = 5, and 3 read after an unrelated block starts its own.
  e.on_access(key_of(1));
  e.on_access(key_of(10));
  e.on_access(key_of(3));
  BlockFacts one = facts_of(1);
  e.describe(key_of(1), one);
  e.describe(key_of(3), three);
  EXPECT_EQ(one.rank->time, 5u);
  EXPECT_EQ(three.rank->time, 7u);
  EXPECT_EQ(e.misuse(), 0u);
}

// An arrival however far out of order goes to its place: one older than 600 arrivals before it
// leaves first (the list's order is indexed, not walked).
TEST(Evictors, LookaheadArrivalFarOutOfOrderGoesToItsPlace) {
  constexpr uint32_t kNewer = 600;
  EvictorOptions o;
  o.capacity_blocks = kNewer + 1;
  LookaheadEvictor e(o);
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  for (uint64_t i = 0; i < kNewer; ++i) {
    BlockFacts f = facts_of(100 + i);
    f.demoted = true;
    f.rank = CarriedRank{10 + i, cls};
    e.on_insert(f);
  }
  BlockFacts late = facts_of(1);
  late.demoted = true;
  late.rank = CarriedRank{1, cls};
  e.on_insert(late);
  BlockFacts middle = facts_of(2);
  middle.demoted = true;
  middle.rank = CarriedRank{10 + kNewer / 2, cls};
  e.on_insert(middle);
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(kNewer + 2, KeyFilter::none(), out), kNewer + 2);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(100));
  // 2 ties with 100 + kNewer / 2 (same time, same depth): either order, next to it.
  const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
  EXPECT_EQ(std::abs(at(2) - at(100 + kNewer / 2)), 1);
  EXPECT_EQ(e.misuse(), 0u);
}

}  // namespace
}  // namespace kvtier::testing
