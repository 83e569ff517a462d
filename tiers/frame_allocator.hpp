// FrameAllocator: O(1), thread-safe allocation of fixed-size frame indices [0, capacity).
//
// Design: a lock-free Treiber stack of free indices (a `next` link per frame and a 64-bit head word
// packing {ABA tag:32, index:32}), plus an allocation bitmap that turns a double free or a free of a
// never-allocated frame into a Status instead of silent corruption. `used()` is an atomic counter, so
// capacity == used() + free_count() at every quiescent point; `audit()` proves it by walking the
// stack and the bitmap (tests call it after every scenario).
//
// The allocator hands out indices only; the arena that owns the bytes (HBM, host pool, NVMe extents)
// maps an index to an address or offset. It holds no lock, so it may be called under any other lock.
// Rejected: a mutex-guarded free list (a lock per alloc on the hot path) and per-thread caches (they
// blur exact accounting and free-frame visibility across threads).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/status.hpp"

namespace kvtier {

class FrameAllocator {
 public:
  static constexpr uint32_t kNoFrame = 0xFFFF'FFFFu;
  static constexpr uint32_t kMaxFrames = kNoFrame - 1;

  // All frames start free. `capacity` may be 0 (a disabled tier); at most kMaxFrames.
  static Result<std::unique_ptr<FrameAllocator>> create(uint32_t capacity);

  FrameAllocator(const FrameAllocator&) = delete;
  FrameAllocator& operator=(const FrameAllocator&) = delete;

  // A free frame, or kResourceExhausted when none is left.
  Result<uint32_t> allocate();
  // Returns a frame. kOutOfRange for an index past capacity; kFailedPrecondition for a frame that is
  // not allocated (double free). Nothing changes on error.
  Status free(uint32_t frame);

  // Marks exactly these frames allocated (they must be free and distinct) and rebuilds the free
  // stack in O(capacity). For rebuilding state at start-up (recovering an NVMe index): not safe
  // concurrently with anything else. Nothing changes on error.
  Status reserve_all(std::span<const uint32_t> frames);

  bool is_allocated(uint32_t frame) const;
  uint32_t capacity() const { return capacity_; }
  uint32_t used() const { return used_.load(std::memory_order_relaxed); }
  uint32_t free_count() const { return capacity_ - used(); }

  // Quiescent-point consistency check: the free stack holds exactly the frames whose bit is clear,
  // each once, and used() equals the number of set bits. Not safe concurrently with alloc/free.
  Status audit() const;

 private:
  explicit FrameAllocator(uint32_t capacity);

  static uint64_t pack(uint32_t tag, uint32_t index) {
    return (static_cast<uint64_t>(tag) << 32) | index;
  }

  const uint32_t capacity_;
  std::unique_ptr<std::atomic<uint32_t>[]> next_;    // [capacity] link to the next free frame
  std::unique_ptr<std::atomic<uint64_t>[]> bitmap_;  // [ceil(capacity/64)] 1 = allocated
  alignas(64) std::atomic<uint64_t> head_;           // {tag, index of first free frame}
  alignas(64) std::atomic<uint32_t> used_{0};
};

}  // namespace kvtier
