// Each eviction policy against a small, obviously-correct reference simulator on hand-made
// traces: the same requests through the evictor (policy_test_util.hpp's driver) and through a
// naive re-statement of the policy (reference_evictors.hpp, lookahead_reference.hpp) must give
// identical hit counts, and for lookahead the same bypasses and learned gaps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/lfu_evictor.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/lru_evictor.hpp"
#include "scheduler/policies/prefix_aware_evictor.hpp"
#include "scheduler/policies/s3fifo_evictor.hpp"
#include "tests/scheduler/policies/lookahead_reference.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"
#include "tests/scheduler/policies/reference_evictors.hpp"

namespace kvtier::testing {
namespace {

TEST(EvictorsVsReference, LruOnSinglesAndChains) {
  for (uint64_t cap : {1, 2, 5, 17, 40}) {
    const auto singles_trace = singles(zipf_ids(600, 60, cap));
    EXPECT_EQ(run_policy<LruEvictor>(cap, singles_trace), ref_lru(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap);
    EXPECT_EQ(run_policy<LruEvictor>(cap, chains), ref_lru(cap, chains)) << cap;
  }
}

TEST(EvictorsVsReference, LfuOnSinglesAndChains) {
  for (uint64_t cap : {1, 3, 8, 25}) {
    const auto singles_trace = singles(zipf_ids(150, 40, cap + 7));
    EXPECT_EQ(run_policy<LfuEvictor>(cap, singles_trace), ref_lfu(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap + 100);
    std::vector<Request> short_chains(chains.begin(), chains.begin() + 40);  // counts < 15
    EXPECT_EQ(run_policy<LfuEvictor>(cap, short_chains), ref_lfu(cap, short_chains)) << cap;
  }
}

TEST(EvictorsVsReference, S3FifoOnSinglesAndChains) {
  for (uint64_t cap : {1, 4, 10, 30}) {
    const auto singles_trace = singles(zipf_ids(800, 80, cap + 3));
    EXPECT_EQ(run_policy<S3FifoEvictor>(cap, singles_trace), ref_s3fifo(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap + 50);
    EXPECT_EQ(run_policy<S3FifoEvictor>(cap, chains), ref_s3fifo(cap, chains)) << cap;
  }
}

TEST(EvictorsVsReference, PrefixAwareOnChains) {
  // Capacities above the longest chain, so a request never evicts its own parent mid-way.
  for (uint64_t seed : {1, 2, 3}) {
    const auto chains = chain_trace(seed);
    std::size_t longest = 0;
    for (const auto& r : chains) longest = std::max(longest, r.size());
    for (uint64_t cap : {longest + 2, longest + 10, 3 * longest}) {
      EXPECT_EQ(run_policy<PrefixAwareEvictor>(cap, chains), ref_prefix_aware(cap, chains))
          << "seed " << seed << " cap " << cap;
    }
  }
}

// Hints for request i + 1 .. i + lookahead before request i, as the replay keeps its board.
std::function<void(std::size_t)> hinter(HintBoard& board, const std::vector<Request>& reqs,
                                        uint32_t lookahead) {
  return [&board, &reqs, lookahead](std::size_t i) {
    if (lookahead == 0) return;
    const auto add = [&](std::size_t j) {
      std::vector<BlockKey> keys;
      for (uint64_t id : reqs[j]) keys.push_back(key_of(id));
      ASSERT_TRUE(board.add(j, j, keys).ok());
    };
    if (i == 0) {
      for (std::size_t j = 1; j <= lookahead && j < reqs.size(); ++j) add(j);
      return;
    }
    ASSERT_TRUE(board.remove(i).ok());
    if (i + lookahead < reqs.size()) add(i + lookahead);
  };
}

void expect_lookahead_matches_reference(uint64_t cap, uint32_t lookahead,
                                        const std::vector<Request>& reqs, const std::string& what) {
  HintBoard board, ref_board;
  EvictorOptions o;
  o.capacity_blocks = cap;
  o.hints = lookahead ? &board : nullptr;
  LookaheadEvictor e(o);
  const DriveResult got = drive(e, cap, reqs, hinter(board, reqs, lookahead));
  LookaheadRef ref(cap, lookahead ? &ref_board : nullptr);
  const uint64_t want = ref.run(reqs, hinter(ref_board, reqs, lookahead));
  EXPECT_EQ(got.hits, want) << what << " cap " << cap << " lookahead " << lookahead;
  EXPECT_EQ(got.bypassed, ref.bypassed) << what << " cap " << cap << " lookahead " << lookahead;
  EXPECT_EQ(e.misuse(), 0u);
  EXPECT_LE(e.size(), cap);
  for (uint32_t k = 0; k < LookaheadRef::kClasses; ++k) {
    EXPECT_EQ(e.model().expected_gap(k), ref.gap(k)) << what << " class " << k;
  }
}

TEST(EvictorsVsReference, LookaheadOnlineAndWithHints) {
  for (uint64_t cap : {1, 4, 12}) {
    for (uint32_t lookahead : {0u, 3u}) {
      expect_lookahead_matches_reference(
          cap, lookahead, singles(zipf_ids(500, 50, cap * 10 + lookahead)), "singles");
    }
  }
}

TEST(EvictorsVsReference, LookaheadOnChains) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto chains = chain_trace(seed);
    for (uint64_t cap : {3, 8, 20, 40}) {  // 40: a horizon of 320, buckets of 2 events
      for (uint32_t lookahead : {0u, 2u}) {
        expect_lookahead_matches_reference(cap, lookahead, chains,
                                           "chains seed " + std::to_string(seed));
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::testing
