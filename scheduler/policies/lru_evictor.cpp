#include "scheduler/policies/lru_evictor.hpp"

namespace kvtier {

LruEvictor::LruEvictor(const EvictorOptions& options) : index_(options.expected_blocks) {}

void LruEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.reserve_slots(index_.slot_limit());
  lists_.push_front(0, slot);
}

void LruEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.remove(0, slot);
  lists_.push_front(0, slot);
}

void LruEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.remove(0, slot);
  index_.erase(slot);
}

std::size_t LruEvictor::select_victims(std::size_t count, KeyFilter skip,
                                       std::vector<BlockKey>& out) {
  std::size_t added = 0;
  for (uint32_t s = lists_.back(0); s != SlotLists::kNil && added < count; s = lists_.newer(s)) {
    const BlockKey& key = index_.key(s);
    if (skip(key)) continue;
    out.push_back(key);
    ++added;
  }
  return added;
}

std::size_t LruEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes();
}

}  // namespace kvtier
