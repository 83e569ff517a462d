// FrameAllocator: O(1), thread-safe allocation of fixed-size frame indices [0, capacity).
//
// Design: lock-free Treiber stacks of free indices. Each frame has one 32-bit link word that is
// either the next free frame (the frame is on a stack) or kAllocatedMark (it is not), so the word
// that threads the stacks also turns a double free or a free of a never-allocated frame into a
// Status instead of silent corruption: free() claims the frame by a compare-exchange from
// kAllocatedMark, and only one of two racing frees can win. Each stack head packs {ABA tag:32,
// index:32}; every push and pop bumps the tag, so a pop whose view of the head went stale fails its
// compare-exchange and retries.
//
// The free frames are spread over kStripes stacks, each head on its own cache line. A thread pops
// from and pushes to its home stripe, and takes from the others only when its own is empty, so
// threads on different cores do not fight over one head (with a single head, two threads get half
// the pairs each, not twice as many). Every free frame stays visible to every thread. The price:
// allocate() reports kResourceExhausted after one pass over the stripes finds them all empty, so
// while another thread is freeing at that moment, "exhausted" can precede the free by an instant.
//
// Cost per alloc+free pair: three locked instructions (pop, claim, push). The count of frames in
// use is kept in per-thread slots that only their owning thread writes (a plain load and store, no
// locked instruction); used() sums the slots any thread has had (a process-wide high-water
// mark), so its cost follows the threads that ever allocated, not kCounterSlots. The sum is exact
// at every quiescent point, so capacity == used() + free_count() there and audit() proves it by
// walking the stacks and the links; while other threads allocate, used() is a snapshot that can be
// off by the operations in flight (it is clamped to [0, capacity]). Threads beyond kCounterSlots
// share one more slot through an atomic add, and home stripe 0.
//
// A frame can be retired (an NVMe extent on a bad sector, or on a drive taken out of service): its
// link word then holds kRetiredMark, it is neither used nor free, and in_service() = capacity() -
// retired() is what the tier can hold; capacity() stays the size of the index space. unretire()
// puts one back on a free stack (a drive readmitted).
//
// The allocator hands out indices only; the arena that owns the bytes (HBM, host pool, NVMe
// extents) maps an index to an address or offset. It holds no lock, so it may be called under any
// other lock. Rejected: a mutex-guarded free list (a lock per alloc on the hot path), a separate
// allocation bitmap (one more locked instruction per alloc and per free for what the link word
// already says), a shared atomic used-counter (two more locked instructions per pair, 40% of the
// pair's cost), and per-thread frame caches (they hide free frames: a frame cached by one thread is
// invisible to another that then finds the tier "full" for as long as the cache holds it).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/status.hpp"

namespace kvtier {

class FrameAllocator {
 public:
  static constexpr uint32_t kNoFrame = 0xFFFF'FFFFu;
  // Two link values mark allocated and retired frames, so indices stop below them.
  static constexpr uint32_t kMaxFrames = kNoFrame - 2;
  // Threads that count their allocations in a private slot (see the header comment); the slots are
  // process-wide, so a thread has the same one in every allocator.
  static constexpr uint32_t kCounterSlots = 64;
  // Free stacks; a thread's home stripe is its counter slot modulo kStripes.
  static constexpr uint32_t kStripes = 8;

  // All frames start free. `capacity` may be 0 (a disabled tier); at most kMaxFrames.
  static Result<std::unique_ptr<FrameAllocator>> create(uint32_t capacity);

  FrameAllocator(const FrameAllocator&) = delete;
  FrameAllocator& operator=(const FrameAllocator&) = delete;

  // A free frame, or kResourceExhausted when none is left.
  Result<uint32_t> allocate();
  // Returns a frame. kOutOfRange for an index past capacity; kFailedPrecondition for a frame that
  // is not allocated (double free). Nothing changes on error.
  Status free(uint32_t frame);
  // Takes an allocated frame out of service for good: it is never handed out again, and used()
  // and in_service() drop by one. kOutOfRange past capacity; kFailedPrecondition for a frame that
  // is not allocated. Nothing changes on error.
  Status retire(uint32_t frame);
  // Puts a retired frame back in service, free. kOutOfRange past capacity; kFailedPrecondition
  // for a frame that is not retired. Nothing changes on error.
  Status unretire(uint32_t frame);
  // Puts up to `most` retired frames back in service, the lowest indices first, and returns how
  // many; O(capacity). For a count of frames that mirrors another allocator's (any frame will do).
  uint32_t unretire_up_to(uint32_t most);

  // Marks exactly these frames allocated (they must be free and distinct) and rebuilds the free
  // stack in O(capacity). For rebuilding state at start-up (recovering an NVMe index): not safe
  // concurrently with anything else. Nothing changes on error.
  Status reserve_all(std::span<const uint32_t> frames);

  bool is_allocated(uint32_t frame) const;
  bool is_retired(uint32_t frame) const;
  // The size of the index space, retired frames included.
  uint32_t capacity() const { return capacity_; }
  uint32_t retired() const { return retired_.load(std::memory_order_relaxed); }
  // The frames that can hold data: capacity() less the retired ones.
  uint32_t in_service() const { return capacity_ - retired(); }
  uint32_t used() const;
  uint32_t free_count() const {
    const uint32_t serving = in_service();
    return serving - std::min(used(), serving);  // used() sums counter slots: read it once
  }

  // Quiescent-point consistency check: the free stacks hold exactly the frames whose link is
  // neither kAllocatedMark nor kRetiredMark, each once, used() equals the number of allocated
  // frames and retired() the number of retired ones. Not safe concurrently with alloc/free.
  Status audit() const;

 private:
  // The link value of a frame that is allocated. Never a valid index (indices are < kMaxFrames).
  static constexpr uint32_t kAllocatedMark = kNoFrame - 1;
  // The link value of a retired frame.
  static constexpr uint32_t kRetiredMark = kNoFrame - 2;

  struct alignas(64) CounterSlot {
    std::atomic<int64_t> value{0};
  };
  struct alignas(64) Stripe {
    std::atomic<uint64_t> head{0};  // {tag, index of its first free frame}
  };

  explicit FrameAllocator(uint32_t capacity);

  static uint64_t pack(uint32_t tag, uint32_t index) {
    return (static_cast<uint64_t>(tag) << 32) | index;
  }
  // This thread's stripe; assigns the thread its counter slot on first use.
  static uint32_t home_stripe();
  void add_used(int64_t delta);
  // Pops one frame from stripe `s`, or kNoFrame when it is empty.
  uint32_t pop(uint32_t s);
  // Threads the frames not allocated onto the stripes, in ascending order, each stripe a contiguous
  // range of indices (so a thread walks its own range in order). Quiescent use only.
  void rebuild_stripes();

  const uint32_t capacity_;
  std::unique_ptr<std::atomic<uint32_t>[]> next_;  // [capacity] next free frame, or kAllocatedMark
  std::unique_ptr<CounterSlot[]> used_;            // [kCounterSlots + 1]; the last one is shared
  std::unique_ptr<Stripe[]> stripes_;              // [kStripes]
  std::atomic<uint32_t> retired_{0};
};

}  // namespace kvtier
