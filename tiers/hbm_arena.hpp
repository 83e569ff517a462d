// HbmArena: the HBM tier's frames — device memory from one cudaMalloc, or, without a GPU, an arena
// in host memory behind the same interface ("emulated"; copies then run on the host copy engine).
//
// The backend is resolved once by select_hbm_device (tiers.hbm.backend auto|cuda|emulated): a null
// DeviceApi means emulated. When the device cannot give the whole capacity the arena halves its
// request until it fits and logs what it got (fewer frames, never a crash). Thread-safety and
// invalidation as FrameArena; the DeviceApi is kept alive for the region's release.
#pragma once

#include <memory>

#include "kvtier/config.hpp"
#include "tiers/device_api.hpp"
#include "tiers/frame_arena.hpp"
#include "tiers/host_memory_api.hpp"

namespace kvtier {

class HbmArena final : public FrameArena {
 public:
  // `device` null: emulated in host memory obtained from `memory`.
  static Result<std::unique_ptr<HbmArena>> create(
      const HbmTierConfig& config, const Geometry& geometry, std::shared_ptr<DeviceApi> device,
      std::shared_ptr<HostMemoryApi> memory = system_host_memory());

  const std::shared_ptr<DeviceApi>& device() const { return device_; }

 private:
  HbmArena(std::shared_ptr<DeviceApi> device, std::string backend, const Geometry& geometry,
           Region region, std::unique_ptr<FrameAllocator> allocator)
      : FrameArena(Tier::kHbm, std::move(backend), device != nullptr,
                   PageFormat::as_computed(geometry), std::move(region), std::move(allocator), -1,
                   false),
        device_(std::move(device)) {}

  std::shared_ptr<DeviceApi> device_;
};

}  // namespace kvtier
