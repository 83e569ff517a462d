// EntrySlab: fixed-stride storage for one shard's block entries, addressed by a 32-bit slot.
//
// Slots live in chunks of kChunkSlots entries allocated on demand and never moved, so a slot's
// address is stable until the slot is released; freed slots are reused through an intrusive free
// list threaded through their first bytes. Growth costs one chunk allocation, never a copy of
// existing entries (unlike a std::vector, whose reallocation would pause the shard for a copy of
// all of it). Not thread-safe: the owning shard's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvtier {

class EntrySlab {
 public:
  static constexpr uint32_t kChunkShift = 6;
  static constexpr uint32_t kChunkSlots = 1u << kChunkShift;
  static constexpr uint32_t kNoSlot = 0xFFFF'FFFFu;

  explicit EntrySlab(uint32_t stride = 0) : stride_(stride) {}
  EntrySlab(EntrySlab&&) noexcept = default;
  EntrySlab& operator=(EntrySlab&&) noexcept = default;

  // A slot for a new entry (its bytes are unspecified), or kNoSlot when the 32-bit slot space or
  // memory is exhausted.
  uint32_t allocate();
  // Returns a slot. Its first 8 bytes are overwritten by the free list, which is why a live entry's
  // header must not keep its liveness flag there.
  void release(uint32_t slot);

  std::byte* at(uint32_t slot) const {
    return chunks_[slot >> kChunkShift].get() +
           static_cast<std::size_t>(slot & (kChunkSlots - 1)) * stride_;
  }

  // Slots handed out at least once; every live slot is below this.
  uint32_t high_water() const { return high_water_; }
  uint32_t live() const { return live_; }
  uint32_t stride() const { return stride_; }
  // Heap bytes held: chunks and the chunk directory.
  std::size_t memory_bytes() const {
    return chunks_.size() * static_cast<std::size_t>(kChunkSlots) * stride_ +
           chunks_.capacity() * sizeof(std::unique_ptr<std::byte[]>);
  }

 private:
  uint32_t stride_;
  uint32_t high_water_ = 0;
  uint32_t live_ = 0;
  uint32_t free_head_ = kNoSlot;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
};

}  // namespace kvtier
