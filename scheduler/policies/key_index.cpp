#include "scheduler/policies/key_index.hpp"

#include <new>

namespace kvtier {

uint32_t KeyIndex::insert(const BlockKey& key) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
    keys_[slot] = key;
  } else {
    slot = static_cast<uint32_t>(keys_.size());
    keys_.push_back(key);
  }
  if (!map_.insert(policy_key_hash(key), slot)) {
    free_.push_back(slot);
    return kNone;
  }
  return slot;
}

void KeyIndex::erase(uint32_t slot) {
  const BlockKey key = keys_[slot];
  if (map_.erase(policy_key_hash(key), [&](uint32_t s) { return s == slot; })) {
    free_.push_back(slot);
  }
}

}  // namespace kvtier
