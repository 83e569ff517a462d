#include "scheduler/policies/lfu_evictor.hpp"

#include <algorithm>

namespace kvtier {

LfuEvictor::LfuEvictor(const EvictorOptions& options) : index_(options.expected_blocks) {}

void LfuEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.reserve_slots(index_.slot_limit());
  if (count_.size() < index_.slot_limit()) count_.resize(index_.slot_limit(), 0);
  const uint32_t c = std::min<uint32_t>(kMaxCount, 1 + std::min<uint32_t>(block.hits, kMaxCount));
  count_[slot] = static_cast<uint8_t>(c);
  lists_.push_front(c, slot);
}

void LfuEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  const uint32_t c = count_[slot];
  lists_.remove(c, slot);
  const uint32_t next = std::min<uint32_t>(c + 1, kMaxCount);
  count_[slot] = static_cast<uint8_t>(next);
  lists_.push_front(next, slot);
}

void LfuEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.remove(count_[slot], slot);
  count_[slot] = 0;
  index_.erase(slot);
}

std::size_t LfuEvictor::select_victims(std::size_t count, KeyFilter skip,
                                       std::vector<BlockKey>& out) {
  std::size_t added = 0;
  for (uint32_t c = 1; c <= kMaxCount && added < count; ++c) {
    for (uint32_t s = lists_.back(c); s != SlotLists::kNil && added < count; s = lists_.newer(s)) {
      const BlockKey& key = index_.key(s);
      if (skip(key)) continue;
      out.push_back(key);
      ++added;
    }
  }
  return added;
}

uint32_t LfuEvictor::count_of(const BlockKey& key) const {
  const uint32_t slot = index_.find(key);
  return slot == KeyIndex::kNone ? 0 : count_[slot];
}

std::size_t LfuEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes() + count_.capacity();
}

}  // namespace kvtier
