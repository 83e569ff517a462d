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
// waits for it and is counted when the parent arrives, so a parent knows its children here
// whatever their order of arrival or rank. The children waiting for one key form a doubly linked
// list through two per-slot arrays, its head in a table keyed by the parent's key, so a waiting
// child leaves in O(1) however many siblings wait with it (a shared system prompt's block can
// have thousands of children in a lower tier); the parent's arrival walks its list once. A child
// whose parent left and came back is counted lazily, the next time parent_slot() is asked for it
// (a victim walk asks for each block it passes). 44 bytes per slot, plus ~56 per key that
// children wait for. Rejected: a multimap of waiting children by parent key (a 56-byte node per
// child, and a walk of the siblings to find the one leaving: quadratic in a popular parent's
// children). Not thread-safe (evictors run on the scheduler's loop).
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
      wait_prev_.resize(limit, kNotWaiting);
      wait_next_.resize(limit, kNotWaiting);
    }
  }

  // A new incarnation in `slot` whose parent is `parent`: links it when the parent is tracked,
  // else leaves it waiting for the parent; counts the children that were waiting for this block.
  void attach(const KeyIndex& index, uint32_t slot, const BlockKey& parent) {
    const BlockKey& key = index.key(slot);
    if (wait_prev_[slot] != kNotWaiting) stop_waiting(slot);  // the slot's last stay never left
    incarnation_[slot] = ++incarnations_;
    children_[slot] = 0;
    parent_[slot] = parent;
    link_[slot] = kUnlinked;
    if (parent_slot(index, slot) == KeyIndex::kNone && !parent.is_null() && parent != key) {
      wait_for(slot, parent);
    }
    const auto waiting = waiting_.find(key);
    if (waiting == waiting_.end()) return;
    for (uint32_t child = waiting->second; child != kEndOfList;) {
      const uint32_t next = wait_next_[child];
      wait_prev_[child] = kNotWaiting;
      ++children_[slot];
      link_[child] = incarnation_[slot];
      child = next;
    }
    waiting_.erase(waiting);
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
    if (wait_prev_[slot] != kNotWaiting) {
      stop_waiting(slot);
    } else if (link_[slot] != kUnlinked && !parent_[slot].is_null()) {
      const uint32_t ps = index.find(parent_[slot]);
      if (ps != KeyIndex::kNone && link_[slot] == incarnation_[ps] && children_[ps] > 0) {
        --children_[ps];
      }
    }
    link_[slot] = kUnlinked;
  }

  uint32_t children(uint32_t slot) const { return children_[slot]; }
  const BlockKey& parent(uint32_t slot) const { return parent_[slot]; }
  // Keys that tracked children wait for (not tracked themselves).
  std::size_t awaited_parents() const { return waiting_.size(); }
  std::size_t memory_bytes() const {
    return parent_.capacity() * sizeof(BlockKey) +
           (link_.capacity() + incarnation_.capacity()) * sizeof(uint64_t) +
           (children_.capacity() + wait_prev_.capacity() + wait_next_.capacity()) *
               sizeof(uint32_t) +
           waiting_.size() * kWaitingEntryBytes + waiting_.bucket_count() * sizeof(void*);
  }

 private:
  // Incarnations start at 1: a link of 0 names none.
  static constexpr uint64_t kUnlinked = 0;
  // wait_prev_ of a slot waiting for no parent; wait_next_ of the last child in a waiting list.
  static constexpr uint32_t kNotWaiting = UINT32_MAX;
  static constexpr uint32_t kEndOfList = UINT32_MAX;
  // wait_prev_ of the first child in a waiting list (the table holds it).
  static constexpr uint32_t kFirstWaiting = UINT32_MAX - 1;
  // One awaited parent: a hash node (its key, the first child's slot, next pointer, cached hash)
  // and its allocation header; each bucket adds a pointer.
  static constexpr std::size_t kWaitingEntryBytes = sizeof(BlockKey) + 2 * sizeof(uint64_t) + 16;

  // Puts `slot` first among the children waiting for `parent`.
  void wait_for(uint32_t slot, const BlockKey& parent) {
    const auto [it, first_child] = waiting_.try_emplace(parent, slot);
    wait_next_[slot] = kEndOfList;
    wait_prev_[slot] = kFirstWaiting;
    if (first_child) return;
    wait_next_[slot] = it->second;
    wait_prev_[it->second] = slot;
    it->second = slot;
  }
  // Takes a waiting `slot` out of its parent's list (O(1)).
  void stop_waiting(uint32_t slot) {
    const uint32_t prev = wait_prev_[slot];
    const uint32_t next = wait_next_[slot];
    if (next != kEndOfList) wait_prev_[next] = prev;
    if (prev != kFirstWaiting) {
      wait_next_[prev] = next;
    } else if (next != kEndOfList) {
      waiting_.find(parent_[slot])->second = next;
    } else {
      waiting_.erase(parent_[slot]);
    }
    wait_prev_[slot] = kNotWaiting;
  }

  std::vector<BlockKey> parent_;
  std::vector<uint64_t> link_;         // the parent's incarnation the slot is counted in
  std::vector<uint64_t> incarnation_;  // the slot's current incarnation
  std::vector<uint32_t> children_;
  uint64_t incarnations_ = 0;
  // Children attached while their parent was not tracked: per slot, its neighbours among the
  // children waiting for the same key (kNotWaiting: it waits for none); per awaited key, the
  // first of them.
  std::vector<uint32_t> wait_prev_;
  std::vector<uint32_t> wait_next_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> waiting_;
};

}  // namespace kvtier
