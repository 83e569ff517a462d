#include "bench/replay/reference.hpp"

#include <functional>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

namespace kvtier::replay {

HitTally reference_lru_hits(const ReplayWorkload& w, uint64_t capacity_blocks) {
  constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
  const uint32_t n = w.unique_blocks;
  // A doubly linked list over dense ids; head = most recent.
  std::vector<uint32_t> prev(n, kNil), next(n, kNil);
  std::vector<uint8_t> cached(n, 0);
  uint32_t head = kNil, tail = kNil;
  uint64_t size = 0;
  HitTally hits;
  const auto unlink = [&](uint32_t x) {
    if (prev[x] != kNil)
      next[prev[x]] = next[x];
    else
      head = next[x];
    if (next[x] != kNil)
      prev[next[x]] = prev[x];
    else
      tail = prev[x];
    prev[x] = next[x] = kNil;
  };
  const auto push_front = [&](uint32_t x) {
    prev[x] = kNil;
    next[x] = head;
    if (head != kNil) prev[head] = x;
    head = x;
    if (tail == kNil) tail = x;
  };
  for (std::size_t r = 0; r < w.requests(); ++r) {
    const auto ids = w.request_dense(r);
    uint64_t k = 0;
    while (k < ids.size() && cached[ids[k]]) ++k;
    w.tally_hit(r, k, hits);
    if (capacity_blocks == 0) continue;
    for (uint32_t x : ids) {
      if (cached[x]) {
        unlink(x);
        push_front(x);
        continue;
      }
      cached[x] = 1;
      push_front(x);
      if (++size > capacity_blocks) {
        const uint32_t victim = tail;
        unlink(victim);
        cached[victim] = 0;
        --size;
      }
    }
  }
  return hits;
}

HitTally belady_hits(const ReplayWorkload& w, uint64_t capacity_blocks) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  const std::size_t accesses = w.dense.size();
  // next_use[j]: the position of the next access to the block accessed at j.
  std::vector<uint64_t> next_use(accesses);
  {
    std::vector<uint64_t> last(w.unique_blocks, kNever);
    for (std::size_t j = accesses; j-- > 0;) {
      next_use[j] = last[w.dense[j]];
      last[w.dense[j]] = j;
    }
  }
  std::vector<uint64_t> current(w.unique_blocks, kNever);  // next use of a cached block
  std::vector<uint8_t> cached(w.unique_blocks, 0);
  // Max-heap of (next use, id); entries whose next use is no longer current are stale.
  std::priority_queue<std::pair<uint64_t, uint32_t>> heap;
  uint64_t size = 0;
  HitTally hits;
  for (std::size_t r = 0; r < w.requests(); ++r) {
    const auto ids = w.request_dense(r);
    uint64_t k = 0;
    while (k < ids.size() && cached[ids[k]]) ++k;
    w.tally_hit(r, k, hits);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const uint32_t x = ids[i];
      const uint64_t nu = next_use[w.offsets[r] + i];
      if (cached[x]) {
        current[x] = nu;
        heap.emplace(nu, x);
        continue;
      }
      if (capacity_blocks == 0) continue;
      if (size >= capacity_blocks) {
        while (!heap.empty() &&
               (!cached[heap.top().second] || current[heap.top().second] != heap.top().first)) {
          heap.pop();
        }
        const auto [far, victim] = heap.top();
        if (far <= nu) continue;  // the newcomer is the one used furthest away: not kept
        heap.pop();
        cached[victim] = 0;
        --size;
      }
      cached[x] = 1;
      current[x] = nu;
      heap.emplace(nu, x);
      ++size;
    }
  }
  return hits;
}

HitTally count_oracle_hits(const ReplayWorkload& w, uint64_t capacity_blocks, uint32_t lookahead) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  const std::size_t accesses = w.dense.size();
  // Per access j: the request of the block's next access, and how many accesses follow it.
  std::vector<uint64_t> next_request(accesses);
  std::vector<uint32_t> left(accesses);
  {
    std::vector<uint64_t> last_request(w.unique_blocks, kNever);
    std::vector<uint32_t> later(w.unique_blocks, 0);
    for (std::size_t r = w.requests(); r-- > 0;) {
      for (std::size_t j = w.offsets[r + 1]; j-- > w.offsets[r];) {
        const uint32_t x = w.dense[j];
        next_request[j] = last_request[x];
        left[j] = later[x];
        last_request[x] = r;
        ++later[x];
      }
    }
  }
  // Lowest goes first: (queued, then -next request | references left, last access, -depth).
  using Rank = std::tuple<bool, int64_t, uint64_t, int64_t>;
  struct Block {
    Rank rank;
    uint64_t next_request = kNever;
    int64_t depth = 0;  // in the request that last read it
    bool cached = false;
  };
  std::vector<Block> blocks(w.unique_blocks);
  using Entry = std::pair<Rank, uint32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;  // stale when rank moved
  const auto queued_rank = [](uint64_t next, int64_t depth) {
    return Rank{true, -static_cast<int64_t>(next), 0, -depth};
  };
  uint64_t size = 0;
  HitTally hits;
  for (std::size_t r = 0; r < w.requests(); ++r) {
    // Request r + lookahead joins the queue: the cached blocks it reads rank as queued.
    if (lookahead > 0 && r + lookahead < w.requests()) {
      const std::size_t q = r + lookahead;
      for (std::size_t j = w.offsets[q]; j < w.offsets[q + 1]; ++j) {
        Block& b = blocks[w.dense[j]];
        if (!b.cached || b.next_request != q || std::get<0>(b.rank)) continue;
        b.rank = queued_rank(q, b.depth);
        heap.emplace(b.rank, w.dense[j]);
      }
    }
    const auto ids = w.request_dense(r);
    uint64_t k = 0;
    while (k < ids.size() && blocks[ids[k]].cached) ++k;
    w.tally_hit(r, k, hits);
    bool admitting = capacity_blocks > 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const uint32_t x = ids[i];
      const std::size_t j = w.offsets[r] + i;
      Block& b = blocks[x];
      const uint64_t next = next_request[j];
      const auto depth = static_cast<int64_t>(i);
      const Rank rank = next != kNever && next <= r + lookahead ? queued_rank(next, depth)
                                                                : Rank{false, left[j], j, -depth};
      if (b.cached) {
        b = Block{rank, next, depth, true};
        heap.emplace(rank, x);
        continue;
      }
      if (!admitting) continue;
      if (size >= capacity_blocks) {
        while (!blocks[heap.top().second].cached ||
               blocks[heap.top().second].rank != heap.top().first) {
          heap.pop();
        }
        if (!(heap.top().first < rank)) {
          admitting = false;  // worth less than every cached block: neither it nor its chain
          continue;
        }
        blocks[heap.top().second].cached = false;
        heap.pop();
        --size;
      }
      b = Block{rank, next, depth, true};
      heap.emplace(rank, x);
      ++size;
    }
  }
  return hits;
}

}  // namespace kvtier::replay
