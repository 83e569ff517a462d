#include "scheduler/entry_slab.hpp"

#include <cstring>
#include <new>

namespace kvtier {

uint32_t EntrySlab::allocate() {
  if (free_head_ != kNoSlot) {
    const uint32_t slot = free_head_;
    std::memcpy(&free_head_, at(slot), sizeof(free_head_));
    ++live_;
    return slot;
  }
  if (high_water_ == kNoSlot) return kNoSlot;
  if ((high_water_ >> kChunkShift) == chunks_.size()) {
    std::unique_ptr<std::byte[]> chunk(
        new (std::nothrow) std::byte[static_cast<std::size_t>(kChunkSlots) * stride_]);
    if (!chunk) return kNoSlot;
    chunks_.push_back(std::move(chunk));
  }
  ++live_;
  return high_water_++;
}

void EntrySlab::release(uint32_t slot) {
  std::memcpy(at(slot), &free_head_, sizeof(free_head_));
  free_head_ = slot;
  --live_;
}

}  // namespace kvtier
