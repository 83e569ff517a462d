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
// Counts are settled lazily: a child that arrived before its parent (lower tiers receive chains
// leaf first, by demotion) or whose parent came back is counted the next time parent_slot() is
// asked for it. Such a child is always older in recency than its parent (the parent was placed
// after it), so a victim walk from the tail that asks for each block it passes (prefix_aware)
// has counted it before it reaches the parent. 36 bytes per slot.
// Not thread-safe (evictors run on the scheduler's loop).
#pragma once

#include <cstdint>
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

  // A new incarnation in `slot` whose parent is `parent`; links it when the parent is tracked.
  void attach(const KeyIndex& index, uint32_t slot, const BlockKey& parent) {
    incarnation_[slot] = ++incarnations_;
    children_[slot] = 0;
    parent_[slot] = parent;
    link_[slot] = kUnlinked;
    parent_slot(index, slot);  // links it now when the parent is tracked
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

  // The slot's block is leaving: uncount it from its parent.
  void detach(const KeyIndex& index, uint32_t slot) {
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
           children_.capacity() * sizeof(uint32_t);
  }

 private:
  // Incarnations start at 1: a link of 0 names none.
  static constexpr uint64_t kUnlinked = 0;

  std::vector<BlockKey> parent_;
  std::vector<uint64_t> link_;         // the parent's incarnation the slot is counted in
  std::vector<uint64_t> incarnation_;  // the slot's current incarnation
  std::vector<uint32_t> children_;
  uint64_t incarnations_ = 0;
};

}  // namespace kvtier
