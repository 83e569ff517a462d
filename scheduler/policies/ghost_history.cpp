#include "scheduler/policies/ghost_history.hpp"

namespace kvtier {

uint32_t GhostHistory::count(const BlockKey& key) const {
  const Entry* e = find(key);
  return e == nullptr ? 0 : e->count;
}

const GhostHistory::Entry* GhostHistory::find(const BlockKey& key) const {
  const auto it = map_.find(fingerprint(key));
  return it == map_.end() ? nullptr : &it->second;
}

GhostHistory::Entry* GhostHistory::find(const BlockKey& key) {
  const auto it = map_.find(fingerprint(key));
  return it == map_.end() ? nullptr : &it->second;
}

void GhostHistory::put(const BlockKey& key, const Entry& entry) {
  if (capacity_ == 0) return;
  const uint64_t fp = fingerprint(key);
  const auto [it, inserted] = map_.insert_or_assign(fp, entry);
  if (!inserted) return;  // already in the ring; keeps its position
  if (ring_.size() < capacity_) {
    ring_.push_back(fp);
    return;
  }
  // Full: forget the oldest ring entry (it may already have been taken, then it is a no-op).
  const uint64_t old = ring_[head_];
  ring_[head_] = fp;
  head_ = (head_ + 1) % capacity_;
  if (old != fp) map_.erase(old);
  // The ring can hold stale fingerprints (taken ones), so the map can be smaller than the ring,
  // never larger.
}

uint32_t GhostHistory::take(const BlockKey& key) { return take_entry(key).count; }

GhostHistory::Entry GhostHistory::take_entry(const BlockKey& key) {
  const auto it = map_.find(fingerprint(key));
  if (it == map_.end()) return Entry{};
  const Entry e = it->second;
  map_.erase(it);
  return e;
}

}  // namespace kvtier
