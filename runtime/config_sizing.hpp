// How many frames and extents each tier's capacity holds at the model's geometry.
//
// The one place in runtime/ that turns capacities (bytes) into allocator sizes, shared by
// validation (a tier must hold at least one frame, and no more than a FrameAllocator can index),
// describe_config and `kvtier-bench check`, which opens the allocators with exactly these counts.
// It follows the tiers' layout (tiers/frame_arena.hpp, tiers/nvme_format.hpp):
//   - HBM and host frames are 4096-byte aligned: the frame stride is page_bytes rounded up to 4096.
//   - An NVMe extent is a header (64 bytes, an 8-byte checksum per page and an 8-byte header
//     checksum, rounded up to 4096) and then the block's pages, each at a stride of page_bytes
//     rounded up to 512 (the O_DIRECT alignment; a device with larger logical blocks gets larger
//     strides when the store opens). Each path holds capacity / paths / extent_bytes extents after
//     a 4096-byte superblock.
// Pure arithmetic on a Config; no allocation beyond the result, safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/config.hpp"

namespace kvtier {

inline constexpr uint64_t kFrameAlignment = 4096;
inline constexpr uint64_t kNvmePageAlignment = 512;
inline constexpr uint64_t kNvmeHeaderAlignment = 4096;
inline constexpr uint64_t kNvmeSuperblockBytes = 4096;
inline constexpr uint64_t kNvmeExtentHeaderFixedBytes = 64;
inline constexpr uint64_t kNvmeChecksumBytesPerPage = 8;
inline constexpr uint64_t kNvmeHeaderChecksumBytes = 8;

struct TierSizing {
  uint64_t page_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t frame_bytes = 0;  // stride of an HBM or host frame
  // 64-bit so validation can say "too many" instead of wrapping; FrameAllocator takes uint32.
  uint64_t hbm_frames = 0;
  uint64_t host_frames = 0;

  bool nvme_enabled = false;
  uint64_t nvme_header_bytes = 0;
  uint64_t nvme_page_stride = 0;
  uint64_t nvme_extent_bytes = 0;
  uint64_t nvme_first_offset = kNvmeSuperblockBytes;
  uint64_t nvme_bytes_per_file = 0;
  std::vector<uint64_t> nvme_extents_per_file;  // one per path; empty when disabled

  uint64_t nvme_extents() const;
};

constexpr uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

TierSizing size_tiers(const Config& config);

}  // namespace kvtier
