#include "tiers/frame_arena.hpp"

#include "kvtier/log.hpp"

namespace kvtier {

std::size_t FrameArena::frame_stride(const Geometry& geometry) {
  return frame_stride(PageFormat::as_computed(geometry));
}

std::size_t FrameArena::frame_stride(const PageFormat& format) {
  const std::size_t page = format.page_bytes();
  return (page + kFrameAlignment - 1) / kFrameAlignment * kFrameAlignment;
}

FrameArena::FrameArena(Tier tier, std::string backend, bool device_memory, const PageFormat& format,
                       Region region, std::unique_ptr<FrameAllocator> allocator, int numa_node,
                       bool locked)
    : tier_(tier),
      backend_(std::move(backend)),
      device_memory_(device_memory),
      format_(format),
      frame_bytes_(frame_stride(format)),
      region_(std::move(region)),
      base_(region_.base),
      allocator_(std::move(allocator)),
      numa_node_(numa_node),
      locked_(locked) {}

FrameArena::~FrameArena() {
  if (region_.release) region_.release();
}

Result<std::byte*> FrameArena::checked_frame_address(uint32_t frame) const {
  if (frame >= frame_count()) {
    return out_of_range("frame " + std::to_string(frame) + " is past the " +
                        std::to_string(frame_count()) + " frames of tier " +
                        std::string(tier_name(tier_)));
  }
  return frame_address(frame);
}

Result<uint32_t> FrameArena::frame_of(const void* addr) const {
  const auto* p = static_cast<const std::byte*>(addr);
  if (p < base_ || p >= base_ + region_bytes()) {
    return not_found("address is not inside tier " + std::string(tier_name(tier_)));
  }
  return static_cast<uint32_t>(static_cast<std::size_t>(p - base_) / frame_bytes_);
}

Result<FrameArena::Region> FrameArena::map_with_backoff(
    std::string_view what, uint32_t& frames, std::size_t stride,
    const std::function<Result<Region>(std::size_t)>& try_map) {
  const uint32_t wanted = frames;
  if (wanted == 0) return Region{};
  uint32_t n = wanted;
  while (true) {
    auto region = try_map(std::size_t{n} * stride);
    if (region.ok()) {
      if (n < wanted) {
        log(LogLevel::kWarn, std::string(what) + ": could not allocate " + std::to_string(wanted) +
                                 " frames (" + std::to_string(uint64_t{wanted} * stride) +
                                 " bytes); running with " + std::to_string(n) + " frames (" +
                                 std::to_string(uint64_t{n} * stride) + " bytes)");
      }
      frames = n;
      return region;
    }
    if (region.status().code() != StatusCode::kResourceExhausted || n == 1) {
      return std::move(region).status().with_context(std::string(what) + ": no memory for " +
                                                     std::to_string(n) + " frame(s)");
    }
    n = n / 2;
  }
}

}  // namespace kvtier
