// Naive re-statements of the plain eviction policies (LRU, LFU, S3-FIFO, prefix-aware): linear
// scans over maps, obviously correct and far too slow for real use. The conformance tests drive the
// same hand-made requests through each evictor and through its reference here; the hit counts must
// be identical. The lookahead policy's reference, larger, lives in lookahead_reference.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {

inline uint64_t ref_lru(uint64_t cap, const std::vector<Request>& reqs) {
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

inline uint64_t ref_lfu(uint64_t cap, const std::vector<Request>& reqs) {
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

// S3-FIFO as in the paper, with deques (front = newest). The ghost queue holds (id, stamp); a
// popped entry forgets its id only if it is the id's current entry (a taken id that was put
// again owns a newer one), as GhostHistory's ring slots do.
inline uint64_t ref_s3fifo(uint64_t cap, const std::vector<Request>& reqs) {
  const uint64_t small_target = std::max<uint64_t>(1, cap / 10);
  const uint64_t ghost_cap = cap > small_target ? cap - small_target : 1;
  std::deque<uint64_t> S, M;
  std::deque<std::pair<uint64_t, uint64_t>> G;
  std::map<uint64_t, uint64_t> ghost;  // id -> stamp of its current G entry
  std::map<uint64_t, int> freq;
  uint64_t hits = 0, stamp = 0;
  const auto ghost_put = [&](uint64_t id) {
    if (ghost.count(id)) return;
    if (G.size() >= ghost_cap) {
      const auto [old, old_stamp] = G.back();
      if (ghost.count(old) && ghost[old] == old_stamp) ghost.erase(old);
      G.pop_back();
    }
    G.emplace_front(id, ++stamp);
    ghost[id] = stamp;
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
inline uint64_t ref_prefix_aware(uint64_t cap, const std::vector<Request>& reqs) {
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

}  // namespace kvtier::testing
