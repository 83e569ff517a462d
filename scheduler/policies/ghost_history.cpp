#include "scheduler/policies/ghost_history.hpp"

namespace kvtier {

uint32_t GhostHistory::count(const BlockKey& key) const {
  const auto it = map_.find(fingerprint(key));
  return it == map_.end() ? 0 : it->second.count;
}

void GhostHistory::put(const BlockKey& key, uint32_t count) {
  if (capacity_ == 0) return;
  const uint64_t fp = fingerprint(key);
  if (const auto it = map_.find(fp); it != map_.end()) {
    it->second.count = count;  // keeps its ring place
    return;
  }
  std::size_t pos;
  if (ring_.size() < capacity_) {
    pos = ring_.size();
    ring_.push_back(fp);
  } else {
    // Full: the oldest slot is reused; its key is forgotten unless a newer slot owns it (a key
    // taken and put again owns the slot of its second put).
    pos = head_;
    const uint64_t old = ring_[pos];
    ring_[pos] = fp;
    head_ = (head_ + 1) % capacity_;
    if (const auto it = map_.find(old); it != map_.end() && it->second.ring_pos == pos) {
      map_.erase(it);
    }
  }
  map_.emplace(fp, Slot{count, pos});
}

uint32_t GhostHistory::take(const BlockKey& key) {
  const auto it = map_.find(fingerprint(key));
  if (it == map_.end()) return 0;
  const uint32_t c = it->second.count;
  map_.erase(it);
  return c;
}

}  // namespace kvtier
