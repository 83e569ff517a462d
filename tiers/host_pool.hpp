// HostPool: the host tier's frames in one pinned region — the staging side of every HBM copy and
// the DMA target of every NVMe read.
//
// With a GPU: cudaHostAlloc (pinned, portable, mapped: the fp8 codec kernels of an fp8 host tier
// reach the frames through the mapping), allocated while this thread's memory policy is
// bound to the NUMA node nearest the GPU. Without: mmap with 2 MiB huge pages when the system has
// them (else 4 KiB pages with a transparent-huge-page hint, said once), bound to the chosen node
// with hwloc before the pages are touched, then mlock'ed when permitted (said once when not).
// `numa_node` -1 means "nearest the GPU", or no binding when there is no GPU.
//
// Degradation, never a crash: too little memory -> fewer frames with one log line; pinned
// allocation refused entirely -> the mmap path; no huge pages -> 4 KiB; mlock refused -> unlocked.
// The region is what the NVMe store registers with io_uring as fixed buffers. Thread-safety and
// invalidation as FrameArena.
#pragma once

#include <memory>

#include "kvtier/config.hpp"
#include "tiers/device_api.hpp"
#include "tiers/frame_arena.hpp"
#include "tiers/host_memory_api.hpp"

namespace kvtier {

class HostPool final : public FrameArena {
 public:
  // `device` null: no GPU (mmap path). `memory` is the seam for mmap/mlock/NUMA. Frames hold
  // pages in `format` (the model's pages as computed, or fp8: tiers.host.kv_dtype).
  static Result<std::unique_ptr<HostPool>> create(
      const HostTierConfig& config, const PageFormat& format, std::shared_ptr<DeviceApi> device,
      std::shared_ptr<HostMemoryApi> memory = system_host_memory());
  // Pages as computed.
  static Result<std::unique_ptr<HostPool>> create(
      const HostTierConfig& config, const Geometry& geometry, std::shared_ptr<DeviceApi> device,
      std::shared_ptr<HostMemoryApi> memory = system_host_memory());

  // True when the frames are page-locked (cudaHostAlloc, or mlock succeeded).
  bool pinned() const { return memory_locked(); }

 private:
  using FrameArena::FrameArena;
};

}  // namespace kvtier
