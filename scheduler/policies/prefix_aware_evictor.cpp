#include "scheduler/policies/prefix_aware_evictor.hpp"

#include "scheduler/policies/chain_walk.hpp"

namespace kvtier {

PrefixAwareEvictor::PrefixAwareEvictor(const EvictorOptions& options)
    : index_(options.expected_blocks) {}

// Newest, unless the parent was the block touched just before: then right behind the parent, so
// the chain reads head (newest) to tail (oldest).
void PrefixAwareEvictor::place(uint32_t slot) {
  const uint32_t ps = links_.parent_slot(index_, slot);
  if (ps != KeyIndex::kNone && ps == last_touched_) {
    lists_.insert_older_than(0, ps, slot);
  } else {
    lists_.push_front(0, slot);
  }
  last_touched_ = slot;
}

void PrefixAwareEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.reserve_slots(index_.slot_limit());
  links_.reserve_slots(index_.slot_limit());
  links_.attach(index_, slot, block.parent);
  place(slot);
}

void PrefixAwareEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.remove(0, slot);
  place(slot);
}

void PrefixAwareEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  links_.detach(index_, slot);
  lists_.remove(0, slot);
  if (last_touched_ == slot) last_touched_ = KeyIndex::kNone;
  index_.erase(slot);
}

std::size_t PrefixAwareEvictor::select_victims(std::size_t count, KeyFilter skip,
                                               std::vector<BlockKey>& out) {
  std::size_t added = 0;
  ChainWalk walk(links_, index_);
  const auto room = [&] { return added < count; };
  const auto emit = [&](uint32_t slot) {
    out.push_back(index_.key(slot));
    ++added;
  };
  for (uint32_t s = lists_.back(0); s != SlotLists::kNil && added < count; s = lists_.newer(s)) {
    if (skip(index_.key(s))) {
      walk.left(s, room, emit);
      continue;
    }
    if (walk.wait_for_children(s)) continue;
    emit(s);
    walk.left(s, room, emit);
  }
  return added;
}

uint32_t PrefixAwareEvictor::cached_children(const BlockKey& key) const {
  const uint32_t slot = index_.find(key);
  return slot == KeyIndex::kNone ? 0 : links_.children(slot);
}

std::size_t PrefixAwareEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes() + links_.memory_bytes();
}

}  // namespace kvtier
