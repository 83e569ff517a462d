// ChainLinks: who is whose parent among the blocks one evictor tracks, for the policies that keep
// chains whole (prefix_aware, lookahead).
//
// A block is only useful while its whole prefix is cached (match() stops at the first gap), so
// those policies evict a chain from its tail: they need, per tracked block, how many of its
// children are tracked in the same tier, and where its parent is. Each slot stores its parent's
// key and the parent's incarnation number at link time. Incarnations come from one 64-bit counter
// for all slots (every attach takes the next), so a link names exactly one stay of the parent: a
// parent that left and came back, into any slot, is a new incarnation, the link is seen as stale
// and the child is counted again instead of being taken as counted. Rejected: a generation per
// slot (a parent back in another slot can carry the very number the link recorded).
// A child that arrived before its parent (lower tiers receive chains leaf first, by demotion)
// waits in a table keyed by the parent's key and is counted when the parent arrives, so a parent
// knows its children here whatever their order of arrival or rank. A child whose parent left and
// came back is counted lazily, the next time parent_slot() is asked for it (a victim walk asks for
// each block it passes). 36 bytes per slot, plus ~56 per waiting child.
// Not thread-safe (evictors run on the scheduler's loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class ChainLinks {
 public:
  void reserve_slots(uint32_t limit) {
    if (parent_.size() < limit) {
      parent_.resize(limit);
      link_.resize(limit, kUnlinked);
      incarnation_.resize(limit, 0);
      children_.resize(limit, 0);
    }
  }

  // A new incarnation in `slot` whose parent is `parent`: links it when the parent is tracked,
  // else leaves it waiting for the parent; counts the children that were waiting for this block.
  void attach(const KeyIndex& index, uint32_t slot, const BlockKey& parent) {
    incarnation_[slot] = ++incarnations_;
    children_[slot] = 0;
    parent_[slot] = parent;
    link_[slot] = kUnlinked;
    if (parent_slot(index, slot) == KeyIndex::kNone && !parent.is_null()) {
      waiting_.emplace(parent, slot);
    }
    const BlockKey& key = index.key(slot);
    const auto [first, last] = waiting_.equal_range(key);
    for (auto it = first; it != last; ++it) {
      const uint32_t child = it->second;
      if (link_[child] == kUnlinked && parent_[child] == key) {
        ++children_[slot];
        link_[child] = incarnation_[slot];
      }
    }
    waiting_.erase(first, last);
  }

  // The tracked parent's slot, linking (and counting) the block now if it was not linked to the
  // parent's current incarnation; KeyIndex::kNone when the parent is not tracked.
  uint32_t parent_slot(const KeyIndex& index, uint32_t slot) {
    if (parent_[slot].is_null()) return KeyIndex::kNone;
    const uint32_t ps = index.find(parent_[slot]);
    if (ps == KeyIndex::kNone || ps == slot) return KeyIndex::kNone;
    if (link_[slot] != incarnation_[ps]) {
      ++children_[ps];
      link_[slot] = incarnation_[ps];
    }
    return ps;
  }

  // The slot's block is leaving: uncount it from its parent, or stop it waiting for one.
  void detach(const KeyIndex& index, uint32_t slot) {
    if (link_[slot] == kUnlinked && !parent_[slot].is_null()) {
      const auto [first, last] = waiting_.equal_range(parent_[slot]);
      for (auto it = first; it != last; ++it) {
        if (it->second == slot) {
          waiting_.erase(it);
          break;
        }
      }
    }
    if (link_[slot] != kUnlinked && !parent_[slot].is_null()) {
      const uint32_t ps = index.find(parent_[slot]);
      if (ps != KeyIndex::kNone && link_[slot] == incarnation_[ps] && children_[ps] > 0) {
        --children_[ps];
      }
    }
    link_[slot] = kUnlinked;
  }

  uint32_t children(uint32_t slot) const { return children_[slot]; }
  const BlockKey& parent(uint32_t slot) const { return parent_[slot]; }
  std::size_t memory_bytes() const {
    return parent_.capacity() * sizeof(BlockKey) +
           (link_.capacity() + incarnation_.capacity()) * sizeof(uint64_t) +
           children_.capacity() * sizeof(uint32_t) + waiting_.size() * kWaitingEntryBytes +
           waiting_.bucket_count() * sizeof(void*);
  }

 private:
  // Incarnations start at 1: a link of 0 names none.
  static constexpr uint64_t kUnlinked = 0;
  // One waiting child: a hash node (the parent's key, the slot, next pointer, cached hash) and
  // its allocation header; each bucket adds a pointer.
  static constexpr std::size_t kWaitingEntryBytes = sizeof(BlockKey) + 2 * sizeof(uint64_t) + 16;

  std::vector<BlockKey> parent_;
  std::vector<uint64_t> link_;         // the parent's incarnation the slot is counted in
  std::vector<uint64_t> incarnation_;  // the slot's current incarnation
  std::vector<uint32_t> children_;
  uint64_t incarnations_ = 0;
  // Children attached while their parent was not tracked, by the parent's key.
  std::unordered_multimap<BlockKey, uint32_t, BlockKeyHash> waiting_;
};

}  // namespace kvtier
