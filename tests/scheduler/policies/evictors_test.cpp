// Each eviction policy against a small, obviously-correct reference simulator on hand-made
// traces: the same requests through the evictor (policy_test_util.hpp's driver) and through a
// naive re-statement of the policy (linear scans over a map) must give identical hit counts.
// Plus the edge cases: capacity 0 and 1, everything refused by the filter, re-insertion, misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/lfu_evictor.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/lru_evictor.hpp"
#include "scheduler/policies/prefix_aware_evictor.hpp"
#include "scheduler/policies/s3fifo_evictor.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

// ---- Reference simulators -------------------------------------------------------------------

uint64_t ref_lru(uint64_t cap, const std::vector<Request>& reqs) {
  std::map<uint64_t, uint64_t> t;  // id -> last touch
  uint64_t now = 0, hits = 0;
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && t.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (!t.count(id)) {
        if (cap == 0) continue;
        if (t.size() >= cap) {
          auto v = std::min_element(t.begin(), t.end(),
                                    [](auto& a, auto& b) { return a.second < b.second; });
          t.erase(v);
        }
      }
      t[id] = ++now;
    }
  }
  return hits;
}

uint64_t ref_lfu(uint64_t cap, const std::vector<Request>& reqs) {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> m;  // id -> (count, last touch)
  uint64_t now = 0, hits = 0;
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && m.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (m.count(id)) {
        m[id] = {m[id].first + 1, ++now};
        continue;
      }
      if (cap == 0) continue;
      if (m.size() >= cap) {
        m.erase(std::min_element(m.begin(), m.end(), [](auto& a, auto& b) {
          return a.second < b.second;  // (count, time) lexicographic
        }));
      }
      m[id] = {1, ++now};
    }
  }
  return hits;
}

// S3-FIFO as in the paper, with deques (front = newest).
uint64_t ref_s3fifo(uint64_t cap, const std::vector<Request>& reqs) {
  const uint64_t small_target = std::max<uint64_t>(1, cap / 10);
  const uint64_t ghost_cap = cap > small_target ? cap - small_target : 1;
  std::deque<uint64_t> S, M, G;
  std::set<uint64_t> ghost;
  std::map<uint64_t, int> freq;
  uint64_t hits = 0;
  const auto ghost_put = [&](uint64_t id) {
    if (ghost.count(id)) return;
    if (G.size() >= ghost_cap) {
      ghost.erase(G.back());
      G.pop_back();
    }
    G.push_front(id);
    ghost.insert(id);
  };
  const auto evict = [&]() {
    while (true) {
      if (!S.empty() && (S.size() >= small_target || M.empty())) {
        const uint64_t t = S.back();
        S.pop_back();
        if (freq[t] > 1) {
          freq[t] = 0;
          M.push_front(t);
          continue;
        }
        ghost_put(t);
        freq.erase(t);
        return;
      }
      const uint64_t t = M.back();
      M.pop_back();
      if (freq[t] > 0) {
        --freq[t];
        M.push_front(t);
        continue;
      }
      freq.erase(t);
      return;
    }
  };
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && freq.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (freq.count(id)) {
        freq[id] = std::min(3, freq[id] + 1);
        continue;
      }
      if (cap == 0) continue;
      if (S.size() + M.size() >= cap) evict();
      freq[id] = 0;
      if (ghost.count(id)) {
        ghost.erase(id);  // its ring slot stays, like GhostHistory's
        M.push_front(id);
      } else {
        S.push_front(id);
      }
    }
  }
  return hits;
}

// Prefix-aware: only leaves (no cached child) are victims; the oldest request first, and within a
// request the deepest block first.
uint64_t ref_prefix_aware(uint64_t cap, const std::vector<Request>& reqs) {
  struct B {
    uint64_t req;
    uint64_t depth;
    uint64_t parent;
    bool has_parent;
  };
  std::map<uint64_t, B> c;
  uint64_t hits = 0;
  for (uint64_t ri = 0; ri < reqs.size(); ++ri) {
    const Request& r = reqs[ri];
    std::size_t k = 0;
    while (k < r.size() && c.count(r[k])) ++k;
    hits += k;
    for (std::size_t j = 0; j < r.size(); ++j) {
      const B b{ri, j, j > 0 ? r[j - 1] : 0, j > 0};
      if (c.count(r[j])) {
        c[r[j]] = b;
        continue;
      }
      if (cap == 0) continue;
      if (c.size() >= cap) {
        std::set<uint64_t> parents;
        for (auto& [id, x] : c) {
          if (x.has_parent && c.count(x.parent)) parents.insert(x.parent);
        }
        uint64_t victim = 0;
        bool found = false;
        for (auto& [id, x] : c) {
          if (parents.count(id)) continue;
          if (!found || x.req < c[victim].req ||
              (x.req == c[victim].req && x.depth > c[victim].depth)) {
            victim = id;
            found = true;
          }
        }
        c.erase(victim);
      }
      c[r[j]] = b;
    }
  }
  return hits;
}

// Lookahead on single-block requests: priority = time + 0.25 * cap * floor(log2(uses)), uses
// remembered across evictions, hinted blocks refreshed instead of evicted, bypass when the
// newcomer's priority does not beat the victim's.
struct LookaheadRef {
  uint64_t cap = 0;
  const HintBoard* hints = nullptr;
  uint64_t now = 0;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> c;  // id -> (time, uses)
  std::map<uint64_t, uint32_t> ghost;
  uint64_t bypassed = 0;

  static uint32_t cls(uint32_t uses) {
    uint32_t c = 0;
    while (uses > 1 && c < 7) {
      uses >>= 1;
      ++c;
    }
    return c;
  }
  double prio(uint64_t t, uint32_t uses) const { return t + 0.25 * cap * cls(uses); }
  bool hinted(uint64_t id) const { return hints && hints->contains(key_of(id)); }
  uint64_t victim() {
    // The policy refreshes at most as many hinted tails as it tracks blocks.
    for (std::size_t budget = c.size();; --budget) {
      auto best = c.begin();
      for (auto it = c.begin(); it != c.end(); ++it) {
        const double pi = prio(it->second.first, it->second.second);
        const double pb = prio(best->second.first, best->second.second);
        if (pi < pb || (pi == pb && cls(it->second.second) < cls(best->second.second))) best = it;
      }
      if (!hinted(best->first) || budget == 0) return best->first;
      best->second.first = ++now;
    }
  }
  uint64_t run(const std::vector<uint64_t>& ids, const std::function<void(std::size_t)>& before) {
    uint64_t hits = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      before(i);
      const uint64_t id = ids[i];
      if (c.count(id)) {
        ++hits;
        c[id] = {++now, c[id].second + 1};
        continue;
      }
      ++now;
      ++ghost[id];
      if (cap == 0) continue;
      if (c.size() >= cap) {
        if (!hinted(id)) {
          const uint64_t v = victim();
          const double mine = now + 0.25 * cap * cls(std::max<uint32_t>(ghost[id], 1));
          if (!(mine > prio(c[v].first, c[v].second))) {
            ++bypassed;
            continue;
          }
        }
        const uint64_t v = victim();
        ghost[v] = c[v].second;
        c.erase(v);
      }
      const uint32_t uses = std::max<uint32_t>(ghost[id], 1);
      ghost.erase(id);
      c[id] = {++now, uses};
    }
    return hits;
  }
};

// ---- Traces ---------------------------------------------------------------------------------

std::vector<uint64_t> zipf_ids(uint64_t n, uint64_t universe, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(universe);
  for (uint64_t i = 0; i < universe; ++i) w[i] = 1.0 / std::pow(i + 1.0, 0.9);
  std::discrete_distribution<uint64_t> d(w.begin(), w.end());
  std::vector<uint64_t> out(n);
  for (auto& x : out) x = d(rng) + 1;
  return out;
}

// Chains: conversations that return with a longer prefix, and one-off chains.
std::vector<Request> chain_trace(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Request> convs(6);
  uint64_t next = 1;
  std::vector<Request> out;
  for (int i = 0; i < 120; ++i) {
    if (rng() % 3 == 0) {
      Request once;
      for (uint64_t n = 1 + rng() % 4; n > 0; --n) once.push_back(next++);
      out.push_back(once);
      continue;
    }
    Request& c = convs[rng() % convs.size()];
    for (uint64_t n = 1 + rng() % 2; n > 0; --n) c.push_back(next++);
    out.push_back(c);
  }
  return out;
}

template <typename E>
uint64_t run_policy(uint64_t cap, const std::vector<Request>& reqs) {
  EvictorOptions o;
  o.capacity_blocks = cap;
  E e(o);
  const uint64_t hits = drive(e, cap, reqs).hits;
  EXPECT_EQ(e.misuse(), 0u);
  EXPECT_LE(e.size(), cap);
  return hits;
}

// ---- Conformance with the references ----------------------------------------------------------

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

TEST(EvictorsVsReference, LookaheadOnlineAndWithHints) {
  for (uint64_t cap : {1, 4, 12}) {
    for (uint32_t lookahead : {0u, 3u}) {
      const auto ids = zipf_ids(500, 50, cap * 10 + lookahead);
      HintBoard board, ref_board;
      const auto hinter = [&](HintBoard& b) {
        return [&, lookahead](std::size_t i) {
          if (lookahead == 0) return;
          if (i == 0) {
            for (std::size_t j = 1; j <= lookahead && j < ids.size(); ++j) {
              const BlockKey k = key_of(ids[j]);
              ASSERT_TRUE(b.add(j, j, std::span(&k, 1)).ok());
            }
            return;
          }
          ASSERT_TRUE(b.remove(i).ok());
          if (i + lookahead < ids.size()) {
            const BlockKey k = key_of(ids[i + lookahead]);
            ASSERT_TRUE(b.add(i + lookahead, i + lookahead, std::span(&k, 1)).ok());
          }
        };
      };
      EvictorOptions o;
      o.capacity_blocks = cap;
      o.hints = lookahead ? &board : nullptr;
      LookaheadEvictor e(o);
      const DriveResult got = drive(e, cap, singles(ids), hinter(board));
      LookaheadRef ref;
      ref.cap = cap;
      ref.hints = lookahead ? &ref_board : nullptr;
      const uint64_t want = ref.run(ids, hinter(ref_board));
      EXPECT_EQ(got.hits, want) << "cap " << cap << " lookahead " << lookahead;
      EXPECT_EQ(got.bypassed, ref.bypassed) << "cap " << cap << " lookahead " << lookahead;
      EXPECT_EQ(e.misuse(), 0u);
    }
  }
}

// ---- Behaviour and edge cases ---------------------------------------------------------------

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

TEST(Evictors, PrefixAwareNeverEvictsAParentBeforeItsChildren) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  // Chain 1 -> 2 -> 3, then an unrelated newer block 9.
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2, 1, 1));
  e.on_insert(facts_of(3, 2, 2));
  e.on_insert(facts_of(9));
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 2u);  // only the leaves: 3 and 9
  EXPECT_EQ(out[0], key_of(3));
  EXPECT_EQ(out[1], key_of(9));
  e.on_erase(key_of(3));
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(2));  // the chain shrinks from its tail
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

TEST(Evictors, LookaheadKeepsHintedBlocksAndReturningOnes) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 100;  // a use-count class is worth 25 events of recency
  o.hints = &board;
  LookaheadEvictor e(o);
  // Block 5 was used twice before (remembered across its eviction); 1 and 2 are new.
  for (int i = 0; i < 2; ++i) {
    e.on_miss(facts_of(5));
    e.on_insert(facts_of(5));
    e.on_erase(key_of(5));
  }
  e.on_miss(facts_of(5));
  e.on_insert(facts_of(5));
  EXPECT_EQ(e.uses_of(key_of(5)), 3u);
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));  // oldest of the once-used; 5 ranks a class higher
  const BlockKey hinted = key_of(1);
  ASSERT_TRUE(board.add(7, 0, std::span(&hinted, 1)).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(2));  // 1 is wanted by a waiting request
  // A hinted newcomer is always admitted.
  EXPECT_TRUE(e.admit(facts_of(1)));
}

}  // namespace
}  // namespace kvtier::testing
