#include "tiers/frame_allocator.hpp"

#include <string>
#include <vector>

namespace kvtier {

Result<std::unique_ptr<FrameAllocator>> FrameAllocator::create(uint32_t capacity) {
  if (capacity > kMaxFrames) {
    return invalid_argument("frame allocator capacity " + std::to_string(capacity) +
                            " exceeds the maximum of " + std::to_string(kMaxFrames) + " frames");
  }
  return std::unique_ptr<FrameAllocator>(new FrameAllocator(capacity));
}

FrameAllocator::FrameAllocator(uint32_t capacity)
    : capacity_(capacity),
      next_(new std::atomic<uint32_t>[capacity]),
      bitmap_(new std::atomic<uint64_t>[(static_cast<uint64_t>(capacity) + 63) / 64]),
      head_(pack(0, capacity == 0 ? kNoFrame : 0)) {
  for (uint32_t i = 0; i < capacity; ++i) {
    next_[i].store(i + 1 < capacity ? i + 1 : kNoFrame, std::memory_order_relaxed);
  }
  for (uint64_t w = 0; w < (static_cast<uint64_t>(capacity) + 63) / 64; ++w) {
    bitmap_[w].store(0, std::memory_order_relaxed);
  }
}

Result<uint32_t> FrameAllocator::allocate() {
  uint64_t head = head_.load(std::memory_order_acquire);
  uint32_t index;
  while (true) {
    index = static_cast<uint32_t>(head);
    if (index == kNoFrame) {
      return resource_exhausted("all " + std::to_string(capacity_) + " frames are in use");
    }
    // May read a link that a concurrent pop already changed; the tagged CAS then fails and retries.
    const uint32_t next = next_[index].load(std::memory_order_relaxed);
    const uint64_t desired = pack(static_cast<uint32_t>(head >> 32) + 1, next);
    if (head_.compare_exchange_weak(head, desired, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      break;
    }
  }
  bitmap_[index / 64].fetch_or(1ull << (index % 64), std::memory_order_relaxed);
  used_.fetch_add(1, std::memory_order_relaxed);
  return index;
}

Status FrameAllocator::free(uint32_t frame) {
  if (frame >= capacity_) {
    return out_of_range("frame " + std::to_string(frame) + " is past the capacity of " +
                        std::to_string(capacity_) + " frames");
  }
  const uint64_t mask = 1ull << (frame % 64);
  const uint64_t before = bitmap_[frame / 64].fetch_and(~mask, std::memory_order_relaxed);
  if ((before & mask) == 0) {
    return failed_precondition("double free of frame " + std::to_string(frame) +
                               " (it is not allocated)");
  }
  uint64_t head = head_.load(std::memory_order_relaxed);
  while (true) {
    next_[frame].store(static_cast<uint32_t>(head), std::memory_order_relaxed);
    const uint64_t desired = pack(static_cast<uint32_t>(head >> 32) + 1, frame);
    if (head_.compare_exchange_weak(head, desired, std::memory_order_release,
                                    std::memory_order_relaxed)) {
      break;
    }
  }
  used_.fetch_sub(1, std::memory_order_relaxed);
  return ok_status();
}

Status FrameAllocator::reserve_all(std::span<const uint32_t> frames) {
  std::vector<bool> wanted(capacity_, false);
  for (uint32_t f : frames) {
    if (f >= capacity_) {
      return out_of_range("cannot reserve frame " + std::to_string(f) + ": capacity is " +
                          std::to_string(capacity_));
    }
    if (wanted[f] || is_allocated(f)) {
      return failed_precondition("cannot reserve frame " + std::to_string(f) +
                                 ": it is already allocated");
    }
    wanted[f] = true;
  }
  for (uint32_t f : frames) bitmap_[f / 64].fetch_or(1ull << (f % 64), std::memory_order_relaxed);
  // Rebuild the free stack in ascending order from the frames whose bit is clear.
  uint32_t first = kNoFrame;
  for (uint32_t i = capacity_; i-- > 0;) {
    if (!is_allocated(i)) {
      next_[i].store(first, std::memory_order_relaxed);
      first = i;
    }
  }
  const uint64_t tag = head_.load(std::memory_order_relaxed) >> 32;
  head_.store(pack(static_cast<uint32_t>(tag + 1), first), std::memory_order_release);
  used_.fetch_add(static_cast<uint32_t>(frames.size()), std::memory_order_relaxed);
  return ok_status();
}

bool FrameAllocator::is_allocated(uint32_t frame) const {
  if (frame >= capacity_) return false;
  return (bitmap_[frame / 64].load(std::memory_order_relaxed) >> (frame % 64)) & 1u;
}

Status FrameAllocator::audit() const {
  std::vector<bool> on_stack(capacity_, false);
  uint32_t free_walked = 0;
  for (uint32_t i = static_cast<uint32_t>(head_.load(std::memory_order_acquire)); i != kNoFrame;
       i = next_[i].load(std::memory_order_relaxed)) {
    if (i >= capacity_) return internal_error("free stack links to frame " + std::to_string(i));
    if (on_stack[i]) return internal_error("frame " + std::to_string(i) + " is free twice");
    if (is_allocated(i)) {
      return internal_error("frame " + std::to_string(i) + " is on the free stack but allocated");
    }
    on_stack[i] = true;
    ++free_walked;
  }
  uint32_t allocated = 0;
  for (uint32_t i = 0; i < capacity_; ++i) allocated += is_allocated(i) ? 1 : 0;
  if (allocated != used() || allocated + free_walked != capacity_) {
    return internal_error("accounting broken: used " + std::to_string(used()) + ", allocated bits " +
                          std::to_string(allocated) + ", free stack " +
                          std::to_string(free_walked) + ", capacity " + std::to_string(capacity_));
  }
  return ok_status();
}

}  // namespace kvtier
