// KeyIndex and SlotLists: the compact per-tier bookkeeping every evictor is built from.
//
// KeyIndex maps a block key to a dense slot number (reused after erase), so a policy keeps its
// per-block state in flat arrays indexed by slot: 16 bytes of key per slot plus ~11 bytes of index
// (FlatKeyMap, load <= 3/4), instead of a heap node per block. SlotLists threads any number of
// doubly linked lists through two u32 arrays (prev, next) over those slots; list heads are
// sentinel nodes stored past the slots, so push/remove/move are O(1) and branch-free of "empty
// list" cases. A slot is in at most one list at a time.
//
// Not thread-safe (evictors run on the scheduler's loop). Rejected: std::unordered_map<BlockKey,
// node> (~64 bytes per block and an allocation each), std::list (another 24 bytes and pointer
// chasing on every victim walk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/block_key.hpp"
#include "scheduler/flat_key_map.hpp"

namespace kvtier {

// A 64-bit hash of a block key: content keys are already uniform, private keys are small
// counters, so both halves are mixed (murmur3's finaliser).
inline uint64_t policy_key_hash(const BlockKey& key) {
  uint64_t x = key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

class KeyIndex {
 public:
  static constexpr uint32_t kNone = FlatKeyMap::kNotFound;

  explicit KeyIndex(uint64_t expected = 0) : map_(expected) {}

  uint32_t find(const BlockKey& key) const {
    return map_.find(policy_key_hash(key), [&](uint32_t s) { return keys_[s] == key; });
  }
  // Adds a key that is not present; returns its slot, or kNone when memory ran out.
  uint32_t insert(const BlockKey& key);
  // Removes the key held by `slot`; the slot is reused by a later insert.
  void erase(uint32_t slot);

  const BlockKey& key(uint32_t slot) const { return keys_[slot]; }
  // One past the highest slot ever handed out: per-slot arrays must be at least this long.
  uint32_t slot_limit() const { return static_cast<uint32_t>(keys_.size()); }
  std::size_t size() const { return map_.size(); }
  std::size_t memory_bytes() const {
    return map_.memory_bytes() + keys_.capacity() * sizeof(BlockKey) +
           free_.capacity() * sizeof(uint32_t);
  }

 private:
  FlatKeyMap map_;
  std::vector<BlockKey> keys_;
  std::vector<uint32_t> free_;
};

class SlotLists {
 public:
  static constexpr uint32_t kNil = 0xFFFF'FFFFu;

  explicit SlotLists(uint32_t lists) : lists_(lists), sizes_(lists, 0) {
    prev_.resize(lists);
    next_.resize(lists);
    for (uint32_t l = 0; l < lists; ++l) prev_[l] = next_[l] = l;
  }

  // Makes room for slots [0, limit).
  void reserve_slots(uint32_t limit) {
    if (limit + lists_ > prev_.size()) {
      prev_.resize(limit + lists_, kNil);
      next_.resize(limit + lists_, kNil);
    }
  }

  // Newest end ("front", MRU) and oldest end ("back", LRU) of a list; kNil when empty.
  uint32_t front(uint32_t list) const { return to_slot(next_[list]); }
  uint32_t back(uint32_t list) const { return to_slot(prev_[list]); }
  // Towards the front (newer) / back (older) from `slot`; kNil past the end.
  uint32_t newer(uint32_t slot) const { return to_slot(prev_[node(slot)]); }
  uint32_t older(uint32_t slot) const { return to_slot(next_[node(slot)]); }

  void push_front(uint32_t list, uint32_t slot) { link_after(list, node(slot), list); }
  void push_back(uint32_t list, uint32_t slot) { link_after(prev_[list], node(slot), list); }
  // Inserts `slot` just older than `anchor` (which is in `list`).
  void insert_older_than(uint32_t list, uint32_t anchor, uint32_t slot) {
    link_after(node(anchor), node(slot), list);
  }
  void remove(uint32_t list, uint32_t slot) {
    const uint32_t n = node(slot);
    next_[prev_[n]] = next_[n];
    prev_[next_[n]] = prev_[n];
    prev_[n] = next_[n] = kNil;
    --sizes_[list];
  }
  bool linked(uint32_t slot) const {
    const uint32_t n = node(slot);
    return n < prev_.size() && prev_[n] != kNil;
  }
  uint64_t size(uint32_t list) const { return sizes_[list]; }
  uint32_t lists() const { return lists_; }
  std::size_t memory_bytes() const {
    return (prev_.capacity() + next_.capacity()) * sizeof(uint32_t) +
           sizes_.capacity() * sizeof(uint64_t);
  }

 private:
  // Node numbers: sentinels first, then slot s at lists_ + s.
  uint32_t node(uint32_t slot) const { return slot + lists_; }
  uint32_t to_slot(uint32_t n) const { return n < lists_ ? kNil : n - lists_; }
  void link_after(uint32_t at, uint32_t n, uint32_t list) {
    next_[n] = next_[at];
    prev_[n] = at;
    prev_[next_[at]] = n;
    next_[at] = n;
    ++sizes_[list];
  }

  uint32_t lists_;
  std::vector<uint64_t> sizes_;
  std::vector<uint32_t> prev_;
  std::vector<uint32_t> next_;
};

}  // namespace kvtier
