// The hint board: per key, how many waiting requests read it and the earliest expected start;
// update() moves a request's start in place or replaces its keys, retain() drops the requests
// an engine no longer hints. Checked against the board rebuilt from scratch after each change.
#include "scheduler/policies/hint_board.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

std::vector<BlockKey> keys_of(std::initializer_list<uint64_t> ids) {
  std::vector<BlockKey> out;
  for (uint64_t id : ids) out.push_back(key_of(id));
  return out;
}

TEST(HintBoard, UpdateMovesAStartInPlaceAndReplacesOtherKeys) {
  HintBoard board;
  ASSERT_TRUE(board.update(1, 50, keys_of({10, 11, 12})).ok());
  ASSERT_TRUE(board.update(2, 20, keys_of({10, 13})).ok());
  EXPECT_EQ(board.find(key_of(10))->requests, 2u);
  EXPECT_EQ(board.find(key_of(10))->earliest_start, 20u);
  EXPECT_EQ(board.find(key_of(11))->earliest_start, 50u);

  // Same keys, a new start: every key of the request follows it.
  ASSERT_TRUE(board.update(1, 5, keys_of({10, 11, 12})).ok());
  EXPECT_EQ(board.find(key_of(10))->requests, 2u);
  EXPECT_EQ(board.find(key_of(10))->earliest_start, 5u);
  EXPECT_EQ(board.find(key_of(12))->earliest_start, 5u);
  ASSERT_TRUE(board.update(2, 1, keys_of({10, 13})).ok());
  EXPECT_EQ(board.find(key_of(10))->earliest_start, 1u);

  // Other keys: the old ones leave the board, the new ones are read by it.
  ASSERT_TRUE(board.update(1, 7, keys_of({10, 14})).ok());
  EXPECT_FALSE(board.contains(key_of(11)));
  EXPECT_FALSE(board.contains(key_of(12)));
  EXPECT_EQ(board.find(key_of(14))->earliest_start, 7u);
  EXPECT_EQ(board.find(key_of(10))->requests, 2u);
  EXPECT_EQ(board.requests(), 2u);
  EXPECT_EQ(board.keys(), 3u);  // 10, 13, 14

  // A key repeated within a request counts once, and moves once.
  ASSERT_TRUE(board.update(3, 9, keys_of({15, 15})).ok());
  EXPECT_EQ(board.find(key_of(15))->requests, 1u);
  ASSERT_TRUE(board.update(3, 2, keys_of({15, 15})).ok());
  EXPECT_EQ(board.find(key_of(15))->earliest_start, 2u);
  ASSERT_TRUE(board.remove(3).ok());
  EXPECT_FALSE(board.contains(key_of(15)));
}

TEST(HintBoard, RetainDropsTheRequestsNoLongerHinted) {
  HintBoard board;
  ASSERT_TRUE(board.add(1, 3, keys_of({10, 11})).ok());
  ASSERT_TRUE(board.add(2, 4, keys_of({11, 12})).ok());
  ASSERT_TRUE(board.add(3, 5, keys_of({13})).ok());
  board.retain([](uint64_t id) { return id == 2; });
  EXPECT_EQ(board.requests(), 1u);
  EXPECT_FALSE(board.contains(key_of(10)));
  EXPECT_FALSE(board.contains(key_of(13)));
  EXPECT_EQ(board.find(key_of(11))->requests, 1u);
  EXPECT_EQ(board.find(key_of(11))->earliest_start, 4u);
  EXPECT_EQ(board.remove(1).code(), StatusCode::kNotFound);
}

// Random queues hinted again and again (new starts, now and then new keys, requests leaving and
// arriving): after each, every key reads as on a board built from the queue alone.
TEST(HintBoard, UpdatedBoardMatchesOneBuiltFromTheQueue) {
  std::mt19937_64 rng(7);
  struct Queued {
    uint64_t start;
    std::vector<BlockKey> keys;
  };
  std::map<uint64_t, Queued> queue;
  HintBoard board;
  uint64_t next_id = 1;
  for (int round = 0; round < 300; ++round) {
    // Arrivals and departures.
    if (rng() % 3 == 0 && !queue.empty()) queue.erase(queue.begin());
    if (rng() % 2 == 0) {
      Queued q{rng() % 1000, {}};
      for (uint64_t i = 0, n = 1 + rng() % 6; i < n; ++i) q.keys.push_back(key_of(rng() % 40));
      queue.emplace(next_id++, std::move(q));
    }
    for (auto& [id, q] : queue) {
      q.start = rng() % 1000;
      if (rng() % 10 == 0) q.keys.push_back(key_of(rng() % 40));
    }
    board.retain([&](uint64_t id) { return queue.contains(id); });
    for (const auto& [id, q] : queue) ASSERT_TRUE(board.update(id, q.start, q.keys).ok());

    HintBoard fresh;
    for (const auto& [id, q] : queue) ASSERT_TRUE(fresh.add(id, q.start, q.keys).ok());
    ASSERT_EQ(board.requests(), fresh.requests());
    ASSERT_EQ(board.keys(), fresh.keys());
    for (uint64_t k = 0; k < 40; ++k) {
      const auto got = board.find(key_of(k));
      const auto want = fresh.find(key_of(k));
      ASSERT_EQ(got.has_value(), want.has_value()) << "key " << k << ", round " << round;
      if (!want) continue;
      EXPECT_EQ(got->requests, want->requests) << "key " << k << ", round " << round;
      EXPECT_EQ(got->earliest_start, want->earliest_start) << "key " << k << ", round " << round;
    }
  }
}

}  // namespace
}  // namespace kvtier::testing
