// ChainWalk: one victim walk's rule for chains, in the policies that keep them whole (prefix_aware,
// lookahead): a block goes right after its children.
//
// Every hit on a child is a hit on its parent too, so keeping a child instead of its parent is
// never better, and a parent evicted first leaves its cached children useless. A walk meets
// blocks in its policy's order; a parent met while children of it that this tier tracks are still
// ahead in the walk waits, and goes right after the last of them leaves the walk: chosen, or
// refused by the walk's filter (leaving already in the same plan, or kept with it). So one walk
// can give up a whole chain, tail first; before, prefix_aware offered only the chains' current
// tails, and a plan that needed more than one block of a chain came up short. Per walk: a map
// entry per parent passed, and the parents that waited. Not thread-safe (one walk, on the loop).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "scheduler/policies/chain_links.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class ChainWalk {
 public:
  ChainWalk(ChainLinks& links, const KeyIndex& index) : links_(links), index_(index) {}

  // Whether `slot` has children still ahead in the walk: then it waits, until the last of them
  // leaves (left()). Counts the block in its parent first, if it arrived before the parent.
  bool wait_for_children(uint32_t slot) {
    links_.parent_slot(index_, slot);
    const auto it = passed_.find(slot);
    if (links_.children(slot) <= (it == passed_.end() ? 0u : it->second)) return false;
    parents_.push_back(slot);
    waiting_.insert(slot);
    return true;
  }

  // `slot` left the walk (chosen or refused). Each ancestor whose last child still ahead that
  // was, and that waits, goes now: emit(parent slot), while room() says the walk wants more.
  template <typename Room, typename Emit>
  void left(uint32_t slot, Room&& room, Emit&& emit) {
    for (uint32_t ps = links_.parent_slot(index_, slot); ps != KeyIndex::kNone && room();
         ps = links_.parent_slot(index_, ps)) {
      if (++passed_[ps] < links_.children(ps) || waiting_.erase(ps) == 0) return;
      emit(ps);
    }
  }

  // The blocks that waited and never went, in walk order.
  std::vector<uint32_t> still_waiting() const {
    std::vector<uint32_t> out;
    for (uint32_t p : parents_) {
      if (waiting_.count(p) != 0) out.push_back(p);
    }
    return out;
  }

 private:
  ChainLinks& links_;
  const KeyIndex& index_;
  std::vector<uint32_t> parents_;                  // waited in this walk, in walk order
  std::unordered_set<uint32_t> waiting_;           // of those, the ones not gone yet
  std::unordered_map<uint32_t, uint32_t> passed_;  // per parent slot: its children that left
};

}  // namespace kvtier
