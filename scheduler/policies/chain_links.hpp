// ChainLinks: who is whose parent among the blocks one evictor tracks, for the policies that keep
// chains whole (prefix_aware, lookahead).
//
// A block is only useful while its whole prefix is cached (match() stops at the first gap), so
// those policies evict a chain from its tail: they need, per tracked block, how many of its
// children are tracked in the same tier, and where its parent is. Each slot stores its parent's
// key and the parent's incarnation number at link time; a slot's incarnation changes whenever it
// is reused, so a link to a parent that left and came back is recognised as stale instead of
// corrupting the new incarnation's child count. 28 bytes per slot.
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
      parent_gen_.resize(limit, 0);
      gen_.resize(limit, 0);
      children_.resize(limit, 0);
      linked_.resize(limit, 0);
    }
  }

  // A new incarnation in `slot` whose parent is `parent`; links it when the parent is tracked.
  void attach(const KeyIndex& index, uint32_t slot, const BlockKey& parent) {
    ++gen_[slot];
    children_[slot] = 0;
    parent_[slot] = parent;
    linked_[slot] = 0;
    relink(index, slot);
  }

  // The tracked parent's slot when the link is current (linking it now if the parent arrived
  // after the child), else KeyIndex::kNone.
  uint32_t parent_slot(const KeyIndex& index, uint32_t slot) {
    if (parent_[slot].is_null()) return KeyIndex::kNone;
    const uint32_t ps = index.find(parent_[slot]);
    if (ps == KeyIndex::kNone) return KeyIndex::kNone;
    if (linked_[slot] && parent_gen_[slot] == gen_[ps]) return ps;
    linked_[slot] = 0;
    relink(index, slot);
    return linked_[slot] ? ps : KeyIndex::kNone;
  }

  // The slot's block is leaving: uncount it from its parent.
  void detach(const KeyIndex& index, uint32_t slot) {
    if (linked_[slot] && !parent_[slot].is_null()) {
      const uint32_t ps = index.find(parent_[slot]);
      if (ps != KeyIndex::kNone && parent_gen_[slot] == gen_[ps] && children_[ps] > 0) {
        --children_[ps];
      }
    }
    linked_[slot] = 0;
  }

  uint32_t children(uint32_t slot) const { return children_[slot]; }
  const BlockKey& parent(uint32_t slot) const { return parent_[slot]; }
  std::size_t memory_bytes() const {
    return parent_.capacity() * sizeof(BlockKey) +
           (parent_gen_.capacity() + gen_.capacity() + children_.capacity()) * sizeof(uint32_t) +
           linked_.capacity();
  }

 private:
  void relink(const KeyIndex& index, uint32_t slot) {
    if (parent_[slot].is_null()) return;
    const uint32_t ps = index.find(parent_[slot]);
    if (ps == KeyIndex::kNone || ps == slot) return;
    ++children_[ps];
    parent_gen_[slot] = gen_[ps];
    linked_[slot] = 1;
  }

  std::vector<BlockKey> parent_;
  std::vector<uint32_t> parent_gen_;
  std::vector<uint32_t> gen_;
  std::vector<uint32_t> children_;
  std::vector<uint8_t> linked_;
};

}  // namespace kvtier
