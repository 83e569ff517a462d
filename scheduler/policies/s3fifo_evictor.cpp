#include "scheduler/policies/s3fifo_evictor.hpp"

#include <algorithm>

namespace kvtier {

S3FifoEvictor::S3FifoEvictor(const EvictorOptions& options)
    : small_target_(std::max<uint64_t>(1, options.capacity_blocks / 10)),
      index_(options.expected_blocks),
      ghost_(options.capacity_blocks > small_target_ ? options.capacity_blocks - small_target_
                                                     : 1) {}

void S3FifoEvictor::move(uint32_t slot, uint32_t to, bool front) {
  lists_.remove(queue_[slot] & 3u, slot);
  queue_[slot] = static_cast<uint8_t>(to);
  if (front) {
    lists_.push_front(to, slot);
  } else {
    lists_.push_back(to, slot);
  }
}

void S3FifoEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  lists_.reserve_slots(index_.slot_limit());
  if (count_.size() < index_.slot_limit()) {
    count_.resize(index_.slot_limit(), 0);
    queue_.resize(index_.slot_limit(), 0);
  }
  const uint32_t to = ghost_.take(block.key) != 0 ? kMain : kSmall;
  count_[slot] = 0;
  queue_[slot] = static_cast<uint8_t>(to);
  lists_.push_front(to, slot);
}

void S3FifoEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  count_[slot] = static_cast<uint8_t>(std::min(3, count_[slot] + 1));
}

void S3FifoEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  const uint8_t q = queue_[slot];
  lists_.remove(q & 3u, slot);
  if ((q & 3u) == kSmall || (q & kFromSmall) != 0) ghost_.put(key, 1);
  index_.erase(slot);
}

std::size_t S3FifoEvictor::select_victims(std::size_t count, KeyFilter skip,
                                          std::vector<BlockKey>& out) {
  std::size_t added = 0;
  // Decisions already taken and not yet carried out come first.
  for (uint32_t s = lists_.back(kLeaving); s != SlotLists::kNil && added < count;
       s = lists_.newer(s)) {
    if (skip(index_.key(s))) continue;
    out.push_back(index_.key(s));
    ++added;
  }
  // Every block may be rotated a bounded number of times (a count of 3 takes 3 trips, a refused
  // block one), so the loop ends even when nothing can be chosen.
  uint64_t budget = 5 * (lists_.size(kSmall) + lists_.size(kMain)) + 8;
  while (added < count && budget-- > 0) {
    const bool from_small = lists_.size(kSmall) > 0 &&
                            (lists_.size(kSmall) >= small_target_ || lists_.size(kMain) == 0);
    if (from_small) {
      const uint32_t t = lists_.back(kSmall);
      if (count_[t] > 1) {
        count_[t] = 0;
        move(t, kMain);
        continue;
      }
      if (skip(index_.key(t))) {
        move(t, kSmall);
        continue;
      }
      move(t, kLeaving, /*front=*/true);
      queue_[t] |= kFromSmall;
      out.push_back(index_.key(t));
      ++added;
      continue;
    }
    const uint32_t t = lists_.back(kMain);
    if (t == SlotLists::kNil) break;
    if (count_[t] > 0) {
      --count_[t];
      move(t, kMain);
      continue;
    }
    if (skip(index_.key(t))) {
      move(t, kMain);
      continue;
    }
    move(t, kLeaving, /*front=*/true);
    out.push_back(index_.key(t));
    ++added;
  }
  return added;
}

std::size_t S3FifoEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes() + count_.capacity() + queue_.capacity() +
         ghost_.memory_bytes();
}

}  // namespace kvtier
