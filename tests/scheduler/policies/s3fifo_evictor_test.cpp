// S3-FIFO under refusals and over-fetching: it offers the other queue when every block of one
// is refused, victims that were not erased keep their place until used, and random operations run
// out of victims only when every block is refused.
#include "scheduler/policies/s3fifo_evictor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

// Capacity 100 (small target 10): blocks 1..`in_main` made to enter main (remembered by the
// ghost), then `in_small` newer ones in small.
std::unique_ptr<S3FifoEvictor> s3fifo_with(uint64_t in_main, uint64_t in_small) {
  EvictorOptions o;
  o.capacity_blocks = 100;
  auto e = std::make_unique<S3FifoEvictor>(o);
  for (uint64_t id = 1; id <= in_main; ++id) {
    e->on_insert(facts_of(id));
    e->on_erase(key_of(id));
    e->on_insert(facts_of(id));
  }
  for (uint64_t id = in_main + 1; id <= in_main + in_small; ++id) e->on_insert(facts_of(id));
  EXPECT_EQ(e->main_size(), in_main);
  EXPECT_EQ(e->small_size(), in_small);
  return e;
}

TEST(Evictors, S3FifoOffersMainWhenEverySmallBlockIsRefused) {
  auto e = s3fifo_with(90, 10);
  std::map<uint64_t, int> asked;
  const auto small_pinned = [&](const BlockKey& k) {
    ++asked[k.lo];
    return k.lo > 90;
  };
  std::vector<BlockKey> out;
  ASSERT_EQ(e->select_victims(1, KeyFilter(small_pinned), out), 1u);
  EXPECT_EQ(out[0], key_of(1));                             // main's oldest
  for (const auto& [id, n] : asked) EXPECT_LE(n, 1) << id;  // one second trip per call at most
  EXPECT_EQ(e->small_size(), 10u);
  EXPECT_EQ(e->main_size(), 90u);  // the victim stays tracked (and ranked) until erased
  // Everything refused: each block is asked once, nothing is offered.
  asked.clear();
  const auto all_pinned = [&](const BlockKey& k) {
    ++asked[k.lo];
    return true;
  };
  out.clear();
  EXPECT_EQ(e->select_victims(5, KeyFilter(all_pinned), out), 0u);
  EXPECT_EQ(asked.size(), 100u);
  for (const auto& [id, n] : asked) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(e->misuse(), 0u);
}

TEST(Evictors, S3FifoOffersSmallWhenEveryMainBlockIsRefused) {
  auto e = s3fifo_with(90, 5);  // small below its target: main goes first
  const auto main_pinned = [](const BlockKey& k) { return k.lo <= 90; };
  std::vector<BlockKey> out;
  ASSERT_EQ(e->select_victims(2, KeyFilter(main_pinned), out), 2u);
  EXPECT_EQ(out[0], key_of(91));  // small's oldest
  EXPECT_EQ(out[1], key_of(92));
  out.clear();
  ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));  // without the refusals, main's oldest as before
}

// Victims the caller did not erase (it asked for more than it used, or dropped the plan) keep
// their place: offered first again while unused, ranked again by S3-FIFO's rules once used.
TEST(Evictors, S3FifoVictimsNotErasedKeepTheirPlaceUntilUsed) {
  {
    auto e = s3fifo_with(5, 0);
    std::vector<BlockKey> out;
    ASSERT_EQ(e->select_victims(3, KeyFilter::none(), out), 3u);  // 1, 2, 3
    e->on_erase(key_of(1));
    out.clear();
    ASSERT_EQ(e->select_victims(2, KeyFilter::none(), out), 2u);
    EXPECT_EQ(out[0], key_of(2));  // not used since: still the next to go
    EXPECT_EQ(out[1], key_of(3));
    e->on_access(key_of(2));  // used again: a block of main with a use left
    out.clear();
    ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
    EXPECT_EQ(out[0], key_of(3));
    out.clear();
    ASSERT_EQ(e->select_victims(4, KeyFilter::none(), out), 4u);
    EXPECT_EQ(out[0], key_of(3));
    EXPECT_EQ(out[1], key_of(4));
    EXPECT_EQ(out[2], key_of(5));
    EXPECT_EQ(out[3], key_of(2));  // after one more trip through main
    EXPECT_EQ(e->main_size(), 4u);
  }
  {
    // From small: one used twice since it was offered moves to main; erased, one is remembered.
    auto e = s3fifo_with(0, 12);
    std::vector<BlockKey> out;
    ASSERT_EQ(e->select_victims(2, KeyFilter::none(), out), 2u);  // 1, 2
    e->on_access(key_of(1));
    e->on_access(key_of(1));
    out.clear();
    ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
    EXPECT_EQ(out[0], key_of(2));
    EXPECT_EQ(e->main_size(), 1u);  // 1
    e->on_erase(key_of(2));
    e->on_insert(facts_of(2));  // the ghost remembers it: straight into main
    EXPECT_EQ(e->main_size(), 2u);
    EXPECT_EQ(e->small_size(), 10u);  // 3..12
    EXPECT_EQ(e->misuse(), 0u);
  }
}

// Random inserts, accesses, erases, refusals and over-fetching: S3-FIFO can evict any tracked
// block, so it runs out of victims only when every block it tracks is refused, and it asks the
// filter about a block at most once per call.
TEST(Evictors, S3FifoRandomOpsRunOutOfVictimsOnlyWhenAllAreRefused) {
  for (uint64_t cap : {10, 40, 100}) {
    std::mt19937_64 rng(cap);
    EvictorOptions o;
    o.capacity_blocks = cap;
    S3FifoEvictor e(o);
    std::set<uint64_t> tracked;
    for (int op = 0; op < 6000; ++op) {
      const uint64_t id = 1 + rng() % (2 * cap);
      switch (rng() % 4) {
        case 0:
          if (tracked.count(id)) {
            e.on_access(key_of(id));
          } else {
            e.on_insert(facts_of(id));
            tracked.insert(id);
          }
          break;
        case 1:
          if (tracked.count(id)) e.on_access(key_of(id));
          break;
        case 2:
          if (tracked.count(id)) {
            e.on_erase(key_of(id));
            tracked.erase(id);
          }
          break;
        default: {
          const uint64_t salt = rng();
          const uint64_t mode = rng() % 4;  // refused: none, a half, two thirds, all
          std::map<uint64_t, int> asked;
          const auto refused = [&](const BlockKey& k) {
            ++asked[k.lo];
            return mode == 3 || policy_key_hash(BlockKey{k.lo ^ salt, k.hi}) % (mode + 1) != 0;
          };
          std::size_t free = 0;
          for (uint64_t t : tracked) {
            free += refused(key_of(t)) ? 0 : 1;
          }
          asked.clear();
          const std::size_t want = 1 + rng() % 8;
          std::vector<BlockKey> out;
          const std::size_t got = e.select_victims(want, KeyFilter(refused), out);
          ASSERT_EQ(got, std::min(want, free)) << "cap " << cap << " op " << op;
          std::set<uint64_t> distinct;
          for (const BlockKey& k : out) {
            ASSERT_TRUE(tracked.count(k.lo));
            distinct.insert(k.lo);
          }
          ASSERT_EQ(distinct.size(), out.size());
          for (const auto& [k, n] : asked) ASSERT_LE(n, 1) << "cap " << cap << " op " << op;
          for (const BlockKey& k : out) {
            if (rng() % 2 == 0) continue;
            e.on_erase(k);
            tracked.erase(k.lo);
          }
        }
      }
      ASSERT_EQ(e.size(), tracked.size());
      ASSERT_EQ(e.small_size() + e.main_size(), tracked.size());
    }
    EXPECT_EQ(e.misuse(), 0u);
  }
}

}  // namespace
}  // namespace kvtier::testing
