// shared_prefix_lengths: per sequence of a batch, the leading run of blocks an earlier sequence
// holds, on hand-made batches and against a brute-force count (the longest common prefix with any
// earlier sequence) on random batches of chained keys.
#include "scheduler/shared_prefixes.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "tests/scheduler/page_table_test_util.hpp"

namespace kvtier {
namespace {

using pt_test::content_key;

std::vector<uint32_t> lengths(const std::vector<std::vector<BlockKey>>& batch) {
  std::vector<std::span<const BlockKey>> spans(batch.begin(), batch.end());
  return shared_prefix_lengths(spans);
}

// Keys named by small numbers, as chained keys of a trie would be.
std::vector<BlockKey> keys(std::initializer_list<uint64_t> ids) {
  std::vector<BlockKey> out;
  for (uint64_t id : ids) out.push_back(content_key(id));
  return out;
}

TEST(SharedPrefixes, SequencesThatShareNothingShareNoBlock) {
  EXPECT_EQ(lengths({keys({1, 2}), keys({3, 4, 5}), keys({6})}), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(lengths({}), std::vector<uint32_t>{});
  EXPECT_EQ(lengths({keys({1, 2})}), std::vector<uint32_t>{0});
  EXPECT_EQ(lengths({{}, keys({1}), {}}), (std::vector<uint32_t>{0, 0, 0}));
}

TEST(SharedPrefixes, TheFirstSequenceToHoldABlockOwnsItAndTheOthersShareIt) {
  // A system prompt of two blocks, then three branches, one of which two sequences follow.
  const auto a = keys({1, 2, 3, 4});
  const auto b = keys({1, 2, 3, 5});
  const auto c = keys({1, 2, 6});
  const auto d = keys({1, 2, 3, 4, 7});
  EXPECT_EQ(lengths({a, b, c, d}), (std::vector<uint32_t>{0, 3, 2, 4}));
  // A shorter sequence first owns what it holds; the longer one shares that much.
  EXPECT_EQ(lengths({keys({1, 2}), a}), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(lengths({a, a, a}), (std::vector<uint32_t>{0, 4, 4}));
  // An empty context in between changes nothing.
  EXPECT_EQ(lengths({a, {}, b}), (std::vector<uint32_t>{0, 0, 3}));
}

TEST(SharedPrefixes, KeysThatBreakTheChainAreNotTakenAsShared) {
  // Block 9 under two different first blocks: not the same prefix, so not counted as shared
  // (the batch is charged for it twice, never for less than it holds).
  EXPECT_EQ(lengths({keys({1, 9}), keys({2, 9})}), (std::vector<uint32_t>{0, 0}));
}

// Random batches: contexts are paths in a random trie (a child key per (parent, branch)), some
// of them copies or prefixes of others.
TEST(SharedPrefixes, RandomBatchesAgreeWithTheLongestCommonPrefixWithAnyEarlierSequence) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::map<std::pair<uint64_t, uint32_t>, uint64_t> child;  // (parent id, branch) -> id
    uint64_t next_id = 1;
    const auto key_at = [&](uint64_t parent, uint32_t branch) {
      auto [it, fresh] = child.emplace(std::pair{parent, branch}, next_id);
      if (fresh) ++next_id;
      return it->second;
    };
    const uint32_t sequences = 1 + static_cast<uint32_t>(rng() % 12);
    const uint32_t branches = 1 + static_cast<uint32_t>(rng() % 3);
    std::vector<std::vector<BlockKey>> batch(sequences);
    for (auto& ctx : batch) {
      const uint32_t length = static_cast<uint32_t>(rng() % 9);
      uint64_t parent = 0;
      for (uint32_t b = 0; b < length; ++b) {
        parent = key_at(parent, static_cast<uint32_t>(rng() % branches));
        ctx.push_back(content_key(parent));
      }
    }
    std::vector<uint32_t> expected(sequences, 0);
    for (uint32_t i = 0; i < sequences; ++i) {
      for (uint32_t j = 0; j < i; ++j) {
        const auto mismatch =
            std::mismatch(batch[i].begin(), batch[i].end(), batch[j].begin(), batch[j].end());
        expected[i] =
            std::max(expected[i], static_cast<uint32_t>(mismatch.first - batch[i].begin()));
      }
    }
    ASSERT_EQ(lengths(batch), expected) << "round " << round;
  }
}

}  // namespace
}  // namespace kvtier
