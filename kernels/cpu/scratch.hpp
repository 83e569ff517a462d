// Per-thread scratch buffers for the CPU kernels.
//
// Each thread (the caller's or a oneTBB worker) owns a few growable, 64-byte aligned slots that
// live as long as the thread; a kernel item takes what it needs at its start and never keeps a
// pointer past its end. Growth allocates (and may throw std::bad_alloc, which the public entry
// points turn into a Status); steady state allocates nothing. Rejected: tbb::
// enumerable_thread_specific (the same thing with a lookup per item) and per-call allocation
// (a malloc per item on the decode path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace kvtier::kernels::cpu {

class ThreadScratch {
 public:
  static constexpr int kSlots = 7;

  // Slot `slot` with room for at least `count` floats; contents are unspecified.
  float* floats(int slot, std::size_t count) {
    return static_cast<float*>(bytes(slot, count * sizeof(float)));
  }
  // Slot `slot` with room for at least `count` 16-bit values.
  uint16_t* halves(int slot, std::size_t count) {
    return static_cast<uint16_t*>(bytes(slot, count * sizeof(uint16_t)));
  }
  uint32_t* words(std::size_t count) {
    return static_cast<uint32_t*>(bytes(kSlots - 1, count * sizeof(uint32_t)));
  }

 private:
  struct AlignedFree {
    void operator()(void* p) const noexcept { ::operator delete (p, std::align_val_t{64}); }
  };

  void* bytes(int slot, std::size_t size) {
    if (size > capacity_[slot]) {
      const std::size_t grown = size + size / 2 + 256;
      buffers_[slot].reset(::operator new (grown, std::align_val_t{64}));
      capacity_[slot] = grown;
    }
    return buffers_[slot].get();
  }

  std::unique_ptr<void, AlignedFree> buffers_[kSlots];
  std::size_t capacity_[kSlots] = {};
};

inline ThreadScratch& thread_scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

}  // namespace kvtier::kernels::cpu
