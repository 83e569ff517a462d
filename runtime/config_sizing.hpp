// How many frames and extents each tier's capacity holds at the model's geometry.
//
// The one place in runtime/ that turns capacities (bytes) into allocator sizes, shared by
// validation (a tier must hold at least one frame, and no more than a FrameAllocator can index),
// describe_config and `kvtier-bench check`, which opens the allocators with exactly these counts.
// The layout is the tiers' own, asked of them rather than restated here:
//   - HBM and host frames: FrameArena::frame_stride (the tier's page bytes rounded up to 4096;
//     host pages in fp8 with their scale trailer under tiers.host.kv_dtype: fp8_e4m3).
//   - NVMe extents: ExtentLayout::make at the O_DIRECT alignment of 512 bytes (a header with the
//     per-page checksums, then the block's pages in the tier's page format, fp8 pages included);
//     each path holds capacity / paths / extent_bytes
//     extents after a 4096-byte superblock. A device with larger logical blocks gets a larger
//     alignment, and so slightly larger extents, when the store opens it.
// Pure arithmetic on a Config; no allocation beyond the result, safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/config.hpp"

namespace kvtier {

inline constexpr uint32_t kNvmeSizingAlignment = 512;

struct TierSizing {
  uint64_t page_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t frame_bytes = 0;       // stride of an HBM frame
  uint64_t host_frame_bytes = 0;  // stride of a host frame (smaller when the host holds fp8)
  // 64-bit so validation can say "too many" instead of wrapping; FrameAllocator takes uint32.
  uint64_t hbm_frames = 0;
  uint64_t host_frames = 0;

  bool nvme_enabled = false;
  // Zero when the geometry has no valid extent layout (validation reports the geometry).
  uint64_t nvme_header_bytes = 0;
  uint64_t nvme_page_stride = 0;
  uint64_t nvme_extent_bytes = 0;
  uint64_t nvme_first_offset = 0;
  uint64_t nvme_bytes_per_file = 0;
  std::vector<uint64_t> nvme_extents_per_file;  // one per path; empty when disabled

  uint64_t nvme_extents() const;
};

TierSizing size_tiers(const Config& config);

}  // namespace kvtier
