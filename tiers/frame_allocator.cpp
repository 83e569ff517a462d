#include "tiers/frame_allocator.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

namespace kvtier {
namespace {

// Hands each live thread a distinct counter-slot index in [0, slots), or kNone when all are
// taken. A thread's index returns to the pool when the thread exits; the mutex orders the old
// owner's last counter stores before the new owner's first loads.
class ThreadSlots {
 public:
  static constexpr uint32_t kNone = 0xFFFF'FFFFu;

  explicit ThreadSlots(uint32_t slots) : taken_(slots, false) {}
  uint32_t acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find(taken_.begin(), taken_.end(), false);
    if (it == taken_.end()) return kNone;
    *it = true;
    const auto index = static_cast<uint32_t>(it - taken_.begin());
    // Published before the thread's first count: a reader that sees the count sees the slot.
    if (index >= ever_taken_.load(std::memory_order_relaxed)) {
      ever_taken_.store(index + 1, std::memory_order_release);
    }
    return index;
  }
  // Slots [0, ever_taken()) are every slot a thread has had; the others have never been written.
  uint32_t ever_taken() const { return ever_taken_.load(std::memory_order_acquire); }
  void release(uint32_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    taken_[slot] = false;
  }

 private:
  std::mutex mu_;
  std::vector<bool> taken_;
  std::atomic<uint32_t> ever_taken_{0};
};

// Slots are process-wide: a thread's index is the same in every allocator.
constexpr uint32_t kThreadSlots = FrameAllocator::kCounterSlots;
constexpr uint32_t kUnassigned = 0xFFFF'FFFFu;
constexpr uint32_t kSharedSlot = 0xFFFF'FFFEu;

ThreadSlots& thread_slots() {
  // Never destroyed: threads may exit (and return their slot) during static destruction.
  static ThreadSlots* registry = new ThreadSlots(kThreadSlots);
  return *registry;
}

// The hot path reads only this trivially-initialised word; the lease below, whose destructor
// returns the slot at thread exit, is touched once per thread.
thread_local uint32_t t_slot = kUnassigned;

struct SlotLease {
  uint32_t index = ThreadSlots::kNone;
  ~SlotLease() {
    if (index != ThreadSlots::kNone) thread_slots().release(index);
    // Frees from thread_local destructors that run after this one use the shared slot.
    t_slot = kSharedSlot;
  }
};
thread_local SlotLease t_lease;

[[gnu::noinline]] uint32_t assign_thread_slot() {
  t_lease.index = thread_slots().acquire();
  t_slot = t_lease.index == ThreadSlots::kNone ? kSharedSlot : t_lease.index;
  return t_slot;
}

}  // namespace

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
      used_(new CounterSlot[kCounterSlots + 1]),
      stripes_(new Stripe[kStripes]) {
  for (uint32_t i = 0; i < capacity; ++i) next_[i].store(kNoFrame, std::memory_order_relaxed);
  rebuild_stripes();
}

void FrameAllocator::rebuild_stripes() {
  for (uint32_t s = 0; s < kStripes; ++s) {
    // Stripe s holds the free frames of [begin, end), linked in ascending order.
    const auto begin = static_cast<uint32_t>(static_cast<uint64_t>(capacity_) * s / kStripes);
    const auto end = static_cast<uint32_t>(static_cast<uint64_t>(capacity_) * (s + 1) / kStripes);
    uint32_t first = kNoFrame;
    for (uint32_t i = end; i-- > begin;) {
      const uint32_t link = next_[i].load(std::memory_order_relaxed);
      if (link == kAllocatedMark || link == kRetiredMark) continue;
      next_[i].store(first, std::memory_order_relaxed);
      first = i;
    }
    const uint64_t tag = stripes_[s].head.load(std::memory_order_relaxed) >> 32;
    stripes_[s].head.store(pack(static_cast<uint32_t>(tag + 1), first), std::memory_order_release);
  }
}

[[gnu::always_inline]] inline uint32_t FrameAllocator::home_stripe() {
  uint32_t slot = t_slot;
  if (slot == kUnassigned) [[unlikely]]
    slot = assign_thread_slot();
  return slot < kCounterSlots ? slot % kStripes : 0;
}

[[gnu::always_inline]] inline void FrameAllocator::add_used(int64_t delta) {
  uint32_t slot = t_slot;
  if (slot == kUnassigned) [[unlikely]]
    slot = assign_thread_slot();
  if (slot < kCounterSlots) [[likely]] {
    // Only this thread writes this slot: no read-modify-write instruction needed.
    std::atomic<int64_t>& v = used_[slot].value;
    v.store(v.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  } else {
    used_[kCounterSlots].value.fetch_add(delta, std::memory_order_relaxed);
  }
}

uint32_t FrameAllocator::used() const {
  // Only the slots some thread has had, and the shared one: with a few threads, a few cache lines
  // instead of every slot (the scheduler asks at each placement decision).
  int64_t sum = used_[kCounterSlots].value.load(std::memory_order_relaxed);
  const uint32_t slots = thread_slots().ever_taken();
  for (uint32_t i = 0; i < slots; ++i) sum += used_[i].value.load(std::memory_order_relaxed);
  return static_cast<uint32_t>(std::clamp<int64_t>(sum, 0, capacity_));
}

[[gnu::always_inline]] inline uint32_t FrameAllocator::pop(uint32_t s) {
  std::atomic<uint64_t>& head_word = stripes_[s].head;
  uint64_t head = head_word.load(std::memory_order_acquire);
  while (true) {
    const auto index = static_cast<uint32_t>(head);
    if (index == kNoFrame) return kNoFrame;
    // May read a link that a concurrent pop already changed (even to kAllocatedMark); the tagged
    // compare-exchange then fails and retries.
    const uint32_t next = next_[index].load(std::memory_order_relaxed);
    const uint64_t desired = pack(static_cast<uint32_t>(head >> 32) + 1, next);
    if (head_word.compare_exchange_weak(head, desired, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      return index;
    }
  }
}

Result<uint32_t> FrameAllocator::allocate() {
  const uint32_t home = home_stripe();
  for (uint32_t i = 0; i < kStripes; ++i) {
    const uint32_t index = pop((home + i) % kStripes);
    if (index == kNoFrame) continue;
    next_[index].store(kAllocatedMark, std::memory_order_relaxed);
    add_used(1);
    return index;
  }
  return resource_exhausted("all " + std::to_string(capacity_) + " frames are in use");
}

Status FrameAllocator::free(uint32_t frame) {
  if (frame >= capacity_) {
    return out_of_range("frame " + std::to_string(frame) + " is past the capacity of " +
                        std::to_string(capacity_) + " frames");
  }
  std::atomic<uint64_t>& head_word = stripes_[home_stripe()].head;
  uint64_t head = head_word.load(std::memory_order_relaxed);
  // Claim the frame: only a frame whose link says "allocated" can be freed, once.
  uint32_t expected = kAllocatedMark;
  if (!next_[frame].compare_exchange_strong(expected, static_cast<uint32_t>(head),
                                            std::memory_order_relaxed)) {
    return failed_precondition(expected == kRetiredMark
                                   ? "free of frame " + std::to_string(frame) + ", which is retired"
                                   : "double free of frame " + std::to_string(frame) +
                                         " (it is not allocated)");
  }
  while (!head_word.compare_exchange_weak(head, pack(static_cast<uint32_t>(head >> 32) + 1, frame),
                                          std::memory_order_release, std::memory_order_relaxed)) {
    next_[frame].store(static_cast<uint32_t>(head), std::memory_order_relaxed);
  }
  add_used(-1);
  return ok_status();
}

Status FrameAllocator::retire(uint32_t frame) {
  if (frame >= capacity_) {
    return out_of_range("cannot retire frame " + std::to_string(frame) + ": capacity is " +
                        std::to_string(capacity_));
  }
  uint32_t expected = kAllocatedMark;
  if (!next_[frame].compare_exchange_strong(expected, kRetiredMark, std::memory_order_relaxed)) {
    return failed_precondition("cannot retire frame " + std::to_string(frame) + ": it is " +
                               (expected == kRetiredMark ? "retired already" : "not allocated"));
  }
  retired_.fetch_add(1, std::memory_order_relaxed);
  add_used(-1);
  return ok_status();
}

Status FrameAllocator::unretire(uint32_t frame) {
  if (frame >= capacity_) {
    return out_of_range("cannot unretire frame " + std::to_string(frame) + ": capacity is " +
                        std::to_string(capacity_));
  }
  // Claimed as allocated, then freed: free() is the one place that pushes onto a stack.
  uint32_t expected = kRetiredMark;
  if (!next_[frame].compare_exchange_strong(expected, kAllocatedMark, std::memory_order_relaxed)) {
    return failed_precondition("cannot unretire frame " + std::to_string(frame) +
                               ": it is not retired");
  }
  retired_.fetch_sub(1, std::memory_order_relaxed);
  add_used(1);
  return free(frame);
}

uint32_t FrameAllocator::unretire_up_to(uint32_t most) {
  uint32_t done = 0;
  for (uint32_t f = 0; f < capacity_ && done < most; ++f) {
    if (is_retired(f) && unretire(f).ok()) ++done;
  }
  return done;
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
    if (is_retired(f)) {
      return failed_precondition("cannot reserve frame " + std::to_string(f) + ": it is retired");
    }
    wanted[f] = true;
  }
  for (uint32_t f : frames) next_[f].store(kAllocatedMark, std::memory_order_relaxed);
  rebuild_stripes();
  add_used(static_cast<int64_t>(frames.size()));
  return ok_status();
}

bool FrameAllocator::is_allocated(uint32_t frame) const {
  if (frame >= capacity_) return false;
  return next_[frame].load(std::memory_order_relaxed) == kAllocatedMark;
}

bool FrameAllocator::is_retired(uint32_t frame) const {
  if (frame >= capacity_) return false;
  return next_[frame].load(std::memory_order_relaxed) == kRetiredMark;
}

Status FrameAllocator::audit() const {
  std::vector<bool> on_stack(capacity_, false);
  uint32_t free_walked = 0;
  for (uint32_t s = 0; s < kStripes; ++s) {
    for (auto i = static_cast<uint32_t>(stripes_[s].head.load(std::memory_order_acquire));
         i != kNoFrame; i = next_[i].load(std::memory_order_relaxed)) {
      if (i >= capacity_) {
        return internal_error("free stack " + std::to_string(s) + " links to frame " +
                              std::to_string(i));
      }
      if (on_stack[i]) return internal_error("frame " + std::to_string(i) + " is free twice");
      on_stack[i] = true;
      ++free_walked;
    }
  }
  uint32_t allocated = 0;
  uint32_t retired_links = 0;
  for (uint32_t i = 0; i < capacity_; ++i) {
    if (is_allocated(i)) {
      ++allocated;
    } else if (is_retired(i)) {
      if (on_stack[i]) return internal_error("retired frame " + std::to_string(i) + " is free");
      ++retired_links;
    } else if (!on_stack[i]) {
      return internal_error("frame " + std::to_string(i) +
                            " is neither allocated nor on the free stack");
    }
  }
  int64_t counted = 0;
  for (uint32_t i = 0; i <= kCounterSlots; ++i) {
    counted += used_[i].value.load(std::memory_order_relaxed);
  }
  // used() reads only the slots threads have had: every count must be in them.
  if (counted != allocated || used() != allocated || retired_links != retired() ||
      allocated + free_walked + retired_links != capacity_) {
    return internal_error("accounting broken: used " + std::to_string(counted) +
                          ", allocated links " + std::to_string(allocated) + ", free stack " +
                          std::to_string(free_walked) + ", retired links " +
                          std::to_string(retired_links) + " (counted " + std::to_string(retired()) +
                          "), capacity " + std::to_string(capacity_));
  }
  return ok_status();
}

}  // namespace kvtier
