// Shared helpers of the policy tests: small keys, and a driver that replays hand-made requests
// through one evictor the way the trace replay does (hits = leading cached blocks; then every
// block in order: access, or miss -> admit? -> evict one victim when full -> insert; then the
// request's end, with output_of(i) generated tokens); and the hand-made traces the tests share.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kvtier/block_key.hpp"
#include "scheduler/policies/evictor.hpp"

namespace kvtier::testing {

inline BlockKey key_of(uint64_t id) { return BlockKey{id, uint64_t{1} << 48}; }

inline BlockFacts facts_of(uint64_t id) {
  BlockFacts f;
  f.key = key_of(id);
  return f;
}
inline BlockFacts facts_of(uint64_t id, uint64_t parent, uint32_t depth) {
  BlockFacts f = facts_of(id);
  f.parent = key_of(parent);
  f.depth = depth;
  return f;
}

using Request = std::vector<uint64_t>;  // a chain of block ids, parent first

// The tokens request i of a hand-made trace generated: a spread over the lookahead policy's output
// buckets (below 16, 64, 256 and above), the same for every policy and reference.
inline uint64_t output_of(std::size_t i) { return (i * 97) % 400; }

struct DriveResult {
  uint64_t hits = 0;  // blocks of matched prefixes
  uint64_t bypassed = 0;
};

// `before_request(i)` runs before request i (hint updates).
template <typename BeforeRequest>
DriveResult drive(Evictor& e, uint64_t capacity, const std::vector<Request>& requests,
                  BeforeRequest&& before_request) {
  DriveResult out;
  std::set<uint64_t> cached;
  std::vector<BlockKey> victims;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    before_request(i);
    const Request& r = requests[i];
    std::size_t k = 0;
    while (k < r.size() && cached.count(r[k])) ++k;
    out.hits += k;
    bool dropped = false;
    for (std::size_t j = 0; j < r.size(); ++j) {
      BlockFacts f;
      f.key = key_of(r[j]);
      f.parent = j > 0 ? key_of(r[j - 1]) : BlockKey{};
      f.depth = static_cast<uint32_t>(j);
      f.request_blocks = static_cast<uint32_t>(r.size());
      f.request_hit_blocks = static_cast<uint32_t>(k);
      if (cached.count(r[j])) {
        e.on_access(f.key);
        continue;
      }
      e.on_miss(f);
      if (dropped || capacity == 0) continue;
      if (cached.size() >= capacity) {
        if (!e.admit(f)) {
          ++out.bypassed;
          dropped = true;
          continue;
        }
        victims.clear();
        if (e.select_victims(1, KeyFilter::none(), victims) != 1) continue;
        e.on_erase(victims[0]);
        cached.erase(victims[0].lo);
      }
      e.on_insert(f);
      cached.insert(r[j]);
    }
    std::vector<BlockKey> keys;
    for (uint64_t id : r) keys.push_back(key_of(id));
    e.on_request_end(keys, output_of(i));
  }
  return out;
}

inline DriveResult drive(Evictor& e, uint64_t capacity, const std::vector<Request>& requests) {
  return drive(e, capacity, requests, [](std::size_t) {});
}

// Single-block requests from a list of ids.
inline std::vector<Request> singles(const std::vector<uint64_t>& ids) {
  std::vector<Request> out;
  for (uint64_t id : ids) out.push_back({id});
  return out;
}

// `n` ids drawn from 1..`universe` with Zipf weights (s = 0.9).
inline std::vector<uint64_t> zipf_ids(uint64_t n, uint64_t universe, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(universe);
  for (uint64_t i = 0; i < universe; ++i) w[i] = 1.0 / std::pow(i + 1.0, 0.9);
  std::discrete_distribution<uint64_t> d(w.begin(), w.end());
  std::vector<uint64_t> out(n);
  for (auto& x : out) x = d(rng) + 1;
  return out;
}

// Chains: conversations that return with a longer prefix, and one-off chains.
inline std::vector<Request> chain_trace(uint64_t seed) {
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

// Hits of evictor type E with `cap` blocks over `reqs`, which must stay within capacity and see
// no misuse.
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

}  // namespace kvtier::testing
