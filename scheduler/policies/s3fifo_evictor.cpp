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
  // Refused blocks wait aside for the rest of the call, so the filter is asked about each block
  // once, but still count in their queue's size: the queue S3-FIFO picks is the one it would pick
  // with them in place. Victims count as gone.
  uint64_t refused_small = 0, refused_main = 0;
  // Every step takes a block out of the queues (victim or refused), moves one from small to main
  // (its count reset: once per block) or spends one of a main block's at most 3 uses, so the loop
  // ends even when nothing can be chosen.
  while (added < count) {
    const uint64_t small = lists_.size(kSmall) + refused_small;
    const uint64_t main = lists_.size(kMain) + refused_main;
    bool from_small = small > 0 && (small >= small_target_ || main == 0);
    // A queue whose every remaining block was refused in this call has nothing to give: the other
    // one serves the rest of the call.
    if (lists_.size(from_small ? kSmall : kMain) == 0) from_small = !from_small;
    const uint32_t t = lists_.back(from_small ? kSmall : kMain);
    if (t == SlotLists::kNil) break;
    if (from_small && count_[t] > 1) {
      count_[t] = 0;
      move(t, kMain);
      continue;
    }
    if (!from_small && count_[t] > 0) {
      --count_[t];
      move(t, kMain);
      continue;
    }
    const bool refused = skip(index_.key(t));
    move(t, refused ? kRefused : kLeaving);
    if (from_small) queue_[t] |= kFromSmall;
    if (refused) {
      ++(from_small ? refused_small : refused_main);
      continue;
    }
    out.push_back(index_.key(t));
    ++added;
  }
  // Victims go back to the tail of their queue, first victim oldest: they stay the next to go
  // until the caller erases them, and one used meanwhile is judged by its count like any other.
  // Refused blocks take their second trip from the front, in the order they were refused.
  for (uint32_t s = lists_.front(kLeaving); s != SlotLists::kNil; s = lists_.front(kLeaving)) {
    move(s, origin(s), /*front=*/false);
  }
  for (uint32_t s = lists_.back(kRefused); s != SlotLists::kNil; s = lists_.back(kRefused)) {
    move(s, origin(s));
  }
  return added;
}

std::size_t S3FifoEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes() + count_.capacity() + queue_.capacity() +
         ghost_.memory_bytes();
}

}  // namespace kvtier
