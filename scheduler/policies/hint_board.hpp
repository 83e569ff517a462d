// HintBoard: the engine's waiting queue as the policies see it — for each request that has not
// started yet, the keys of its blocks and when it is expected to start.
//
// The engine announces requests through hints (DESIGN.md, "How an engine uses it", step 7); the
// scheduler (or the trace replay, under --lookahead N) adds each announced request here and
// removes it when it starts or is abandoned. Policies read it: the lookahead evictor keeps blocks
// that a waiting request will read, the prefetcher loads them ahead. Lookups answer "how many
// waiting requests read this key, and the earliest expected start among them" in O(1).
// An engine hints its whole queue again each time it changes, with new expected starts but the
// same keys: update() moves such a request's start in place, without taking its keys off the
// board and putting them back (that was half of hint()'s cost in the benchmark).
//
// Threading: owned and mutated by the scheduler's event loop; readers run on the same thread (the
// evictors are called from it), so there is no lock. Keys repeated within one request count once.
// Rejected: recomputing per-key earliest starts by scanning the queue (O(queue) per lookup on
// the victim walk), and a listener interface that pushes every change into each evictor (the
// lookahead policy only needs to ask about its victim candidates, so it reads lazily).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"

namespace kvtier {

class HintBoard {
 public:
  struct Use {
    uint32_t requests = 0;        // waiting requests that read the key
    uint64_t earliest_start = 0;  // the smallest expected start among them
  };

  // Adds a waiting request. `expected_start` is in any monotonic unit the caller uses for all
  // requests (milliseconds, or the queue position). kAlreadyExists when the id is present.
  Status add(uint64_t request_id, uint64_t expected_start, std::span<const BlockKey> keys);
  // Adds the request, or brings it up to date: with the same keys only its start moves (in
  // place); with other keys it is replaced.
  Status update(uint64_t request_id, uint64_t expected_start, std::span<const BlockKey> keys);
  // Removes a request (it started, or was cancelled). kNotFound when the id is absent.
  Status remove(uint64_t request_id);
  // Removes every request whose id `keep` does not return true for.
  void retain(const std::function<bool(uint64_t request_id)>& keep);
  void clear();

  std::optional<Use> find(const BlockKey& key) const;
  bool contains(const BlockKey& key) const { return find(key).has_value(); }
  std::size_t requests() const { return requests_.size(); }
  std::size_t keys() const { return uses_.size(); }

 private:
  struct Request {
    uint64_t expected_start = 0;
    std::vector<BlockKey> keys;  // as hinted (repeats count once, in uses_)
  };
  struct KeyUses {
    // (expected_start, request_id) of every waiting request reading the key; short (the queue's
    // length at most, usually 1), so a vector beats a tree.
    std::vector<std::pair<uint64_t, uint64_t>> readers;
  };

  std::unordered_map<uint64_t, Request> requests_;
  std::unordered_map<BlockKey, KeyUses, BlockKeyHash> uses_;
};

}  // namespace kvtier
