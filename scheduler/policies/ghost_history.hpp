// GhostHistory: a bounded memory of blocks a tier no longer (or never) held, with a small counter
// per block — how often requests referenced it. S3-FIFO uses it to send returning blocks straight
// to its main queue. (The lookahead policy keeps more per block, in a GhostTable.)
//
// Entries are 64-bit fingerprints of keys in a FIFO ring of fixed capacity; the oldest is
// forgotten when the ring is full, and a key put again keeps its place. Each map entry records the
// ring slot that owns it, so a slot left behind by a take never erases the key's newer entry. A
// fingerprint collision (2^-64 per pair) only misjudges one block's popularity. Not thread-safe
// (evictors run on the scheduler's loop). Rejected: storing full keys (twice the memory for no
// practical gain) and LRU ordering of ghosts (a touch per lookup for no measurable benefit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.hpp"

namespace kvtier {

class GhostHistory {
 public:
  explicit GhostHistory(std::size_t capacity) : capacity_(capacity) {
    ring_.reserve(std::min<std::size_t>(capacity, 1u << 20));
  }

  // The stored counter, or 0 when the key is not remembered.
  uint32_t count(const BlockKey& key) const;
  bool contains(const BlockKey& key) const { return map_.count(fingerprint(key)) != 0; }
  // Remembers the key with `count` (replacing an older counter; the key keeps its ring place).
  void put(const BlockKey& key, uint32_t count);
  // Forgets the key; returns its counter (0 when absent).
  uint32_t take(const BlockKey& key);

  std::size_t size() const { return map_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t memory_bytes() const {
    return ring_.capacity() * sizeof(uint64_t) +
           map_.bucket_count() * (sizeof(void*) + sizeof(uint64_t) + sizeof(Slot) + 16);
  }

 private:
  struct Slot {
    uint32_t count = 0;
    std::size_t ring_pos = 0;  // the ring slot that owns the entry
  };
  static uint64_t fingerprint(const BlockKey& key) {
    return key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull) ^ (key.hi >> 29);
  }

  std::size_t capacity_;
  std::vector<uint64_t> ring_;  // insertion order; may hold fingerprints no longer owned
  std::size_t head_ = 0;        // next ring position to overwrite once full
  std::unordered_map<uint64_t, Slot> map_;
};

}  // namespace kvtier
