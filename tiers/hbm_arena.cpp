#include "tiers/hbm_arena.hpp"

#include <cstdint>

namespace kvtier {

Result<std::unique_ptr<HbmArena>> HbmArena::create(const HbmTierConfig& config,
                                                   const Geometry& geometry,
                                                   std::shared_ptr<DeviceApi> device,
                                                   std::shared_ptr<HostMemoryApi> memory) {
  if (geometry.page_bytes() == 0) return invalid_argument("tiers.hbm: geometry has empty pages");
  const std::size_t stride = frame_stride(geometry);
  const uint64_t wanted = config.capacity_bytes / stride;
  if (wanted > FrameAllocator::kMaxFrames) {
    return invalid_argument("tiers.hbm.capacity_bytes " + std::to_string(config.capacity_bytes) +
                            " is more than " + std::to_string(FrameAllocator::kMaxFrames) +
                            " frames");
  }
  uint32_t frames = static_cast<uint32_t>(wanted);
  Region region;
  if (device) {
    auto mapped = map_with_backoff(
        "tiers.hbm (cuda device " + std::to_string(device->device()) + ")", frames, stride,
        [&](std::size_t bytes) -> Result<Region> {
          // cudaMalloc aligns to at least 256 bytes; the slack lets frames start on 4096.
          auto buffer =
              DeviceBuffer::allocate(device, DeviceBuffer::Kind::kDevice, bytes + kFrameAlignment);
          if (!buffer.ok()) return std::move(buffer).status();
          auto owned = std::make_shared<DeviceBuffer>(std::move(buffer).value());
          const auto raw = reinterpret_cast<uintptr_t>(owned->get());
          const uintptr_t aligned = (raw + kFrameAlignment - 1) / kFrameAlignment * kFrameAlignment;
          return Region{reinterpret_cast<std::byte*>(aligned), bytes,
                        [owned]() mutable { owned->reset(); }};
        });
    if (!mapped.ok()) return std::move(mapped).status();
    region = std::move(mapped).value();
  } else {
    if (!memory) return invalid_argument("tiers.hbm: emulated backend needs host memory");
    auto mapped = map_with_backoff(
        "tiers.hbm (emulated)", frames, stride, [&](std::size_t bytes) -> Result<Region> {
          auto p = memory->map(bytes, false);
          if (!p.ok()) return std::move(p).status();
          memory->advise_huge(*p, bytes).ignore();  // a hint; 4 KiB pages work too
          void* addr = *p;
          return Region{static_cast<std::byte*>(addr), bytes,
                        [memory, addr, bytes] { memory->unmap(addr, bytes); }};
        });
    if (!mapped.ok()) return std::move(mapped).status();
    region = std::move(mapped).value();
  }
  KVTIER_ASSIGN_OR_RETURN(auto allocator, FrameAllocator::create(frames));
  std::string backend = device ? "cuda" : "emulated";
  return std::unique_ptr<HbmArena>(new HbmArena(std::move(device), std::move(backend), geometry,
                                                std::move(region), std::move(allocator)));
}

}  // namespace kvtier
