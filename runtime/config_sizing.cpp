#include "runtime/config_sizing.hpp"

#include "tiers/frame_arena.hpp"
#include "tiers/nvme_format.hpp"

namespace kvtier {

uint64_t TierSizing::nvme_extents() const {
  uint64_t total = 0;
  for (uint64_t n : nvme_extents_per_file) total += n;
  return total;
}

TierSizing size_tiers(const Config& config) {
  const Geometry& g = config.model.geometry;
  TierSizing s;
  s.page_bytes = g.page_bytes();
  s.block_bytes = g.block_bytes();
  s.frame_bytes = FrameArena::frame_stride(g);
  s.host_frame_bytes = FrameArena::frame_stride(config.tiers.host_page_format(g));
  if (s.frame_bytes > 0) s.hbm_frames = config.tiers.hbm.capacity_bytes / s.frame_bytes;
  if (s.host_frame_bytes > 0) s.host_frames = config.tiers.host.capacity_bytes / s.host_frame_bytes;

  const NvmeTierConfig& nvme = config.tiers.nvme;
  s.nvme_enabled = nvme.enabled;
  s.nvme_first_offset = kSuperblockBytes;
  auto layout = ExtentLayout::make(config.tiers.nvme_page_format(g), kNvmeSizingAlignment);
  if (layout.ok()) {
    s.nvme_header_bytes = layout->header_bytes;
    s.nvme_page_stride = layout->page_stride;
    s.nvme_extent_bytes = layout->extent_bytes;
  }
  if (nvme.enabled && !nvme.paths.empty() && s.nvme_extent_bytes > 0) {
    s.nvme_bytes_per_file = nvme.capacity_bytes / nvme.paths.size();
    s.nvme_extents_per_file.assign(nvme.paths.size(), s.nvme_bytes_per_file / s.nvme_extent_bytes);
  }
  return s;
}

}  // namespace kvtier
