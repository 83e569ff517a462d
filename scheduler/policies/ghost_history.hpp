// GhostHistory: a bounded memory of blocks a tier no longer (or never) held — how often requests
// referenced each one, and optionally when it was last referenced and a small tag. S3-FIFO uses
// the count to send returning blocks straight to its main queue; the lookahead policy uses all of
// it to count reuse across evictions and to learn how soon each kind of block comes back (a block
// that returns after its eviction still teaches the tier its reuse gap).
//
// Entries are 64-bit fingerprints of keys in a FIFO ring of fixed capacity; the oldest is
// forgotten when the ring is full. A fingerprint collision (2^-64 per pair) only misjudges one
// block. Not thread-safe (evictors run on the scheduler's loop). Rejected: storing full keys
// (twice the memory for no practical gain) and LRU ordering of ghosts (a touch per lookup for no
// measurable benefit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.hpp"

namespace kvtier {

class GhostHistory {
 public:
  struct Entry {
    uint64_t time = 0;   // the owner's clock at the block's last reference
    uint32_t count = 0;  // references so far
    uint32_t tag = 0;    // owner-defined (the lookahead policy: the block's class)
  };

  explicit GhostHistory(std::size_t capacity) : capacity_(capacity) {
    ring_.reserve(std::min<std::size_t>(capacity, 1u << 20));
  }

  // The stored counter, or 0 when the key is not remembered.
  uint32_t count(const BlockKey& key) const;
  bool contains(const BlockKey& key) const { return map_.count(fingerprint(key)) != 0; }
  // The stored entry, or null when the key is not remembered. Valid until the next put/take.
  const Entry* find(const BlockKey& key) const;
  Entry* find(const BlockKey& key);
  // Remembers the key (replacing an older entry; a key already remembered keeps its ring place).
  void put(const BlockKey& key, uint32_t count) { put(key, Entry{0, count, 0}); }
  void put(const BlockKey& key, const Entry& entry);
  // Forgets the key; returns its counter (0 when absent).
  uint32_t take(const BlockKey& key);
  // Forgets the key; returns its entry (count 0 when absent).
  Entry take_entry(const BlockKey& key);

  std::size_t size() const { return map_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t memory_bytes() const {
    return ring_.capacity() * sizeof(uint64_t) +
           map_.bucket_count() * (sizeof(void*) + sizeof(uint64_t) + sizeof(Entry) + 16);
  }

 private:
  static uint64_t fingerprint(const BlockKey& key) {
    return key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull) ^ (key.hi >> 29);
  }

  std::size_t capacity_;
  std::vector<uint64_t> ring_;  // insertion order; may hold fingerprints already taken
  std::size_t head_ = 0;        // next ring position to overwrite once full
  std::unordered_map<uint64_t, Entry> map_;
};

}  // namespace kvtier
