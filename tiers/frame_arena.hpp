// FrameArena: one tier's page frames — a contiguous region of HBM or host memory cut into frames of
// one page each — and the FrameAllocator that hands them out.
//
// Frames hold pages in the arena's PageFormat: HBM always as computed (attention reads them), the
// host tier as computed or in fp8 with a scale trailer (tiers.host.kv_dtype), so a host frame is
// exactly what the NVMe store writes and reads for it.
//
// A frame is 4096-aligned and `frame_bytes()` apart: page_bytes rounded up to 4096, so the NVMe
// store can DMA straight into a frame with O_DIRECT and read up to the I/O alignment past the page.
// The region is owned here (released by the destructor, after every user is gone); the allocator is
// exposed so the page table allocates through it. `frame_address` maps an index to a device pointer
// (device_memory() == true: not dereferenceable on the host) or a host pointer.
//
// Thread-safety: everything is immutable after create() except the allocator, which is lock-free
// and thread-safe. Rejected: one allocation per frame (tens of thousands of cudaMalloc/mmap calls,
// no single region to register with io_uring) and a virtual interface per backend (the backends
// differ only in how the region is obtained, which HbmArena and HostPool do in create()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {

class FrameArena {
 public:
  static constexpr std::size_t kFrameAlignment = 4096;

  // page_bytes rounded up to kFrameAlignment (pages as computed, or in `format`).
  static std::size_t frame_stride(const Geometry& geometry);
  static std::size_t frame_stride(const PageFormat& format);

  virtual ~FrameArena();
  FrameArena(const FrameArena&) = delete;
  FrameArena& operator=(const FrameArena&) = delete;

  Tier tier() const { return tier_; }
  // "cuda", "emulated" (HBM); "cuda_pinned", "mmap_2m", "mmap_4k" (host).
  std::string_view backend() const { return backend_; }
  bool device_memory() const { return device_memory_; }
  // The model's geometry, whatever the frames hold.
  const Geometry& geometry() const { return format_.geometry; }
  const PageFormat& page_format() const { return format_; }
  // Bytes of one page as this arena holds it.
  std::size_t page_bytes() const { return format_.page_bytes(); }
  std::size_t frame_bytes() const { return frame_bytes_; }
  uint32_t frame_count() const { return allocator_->capacity(); }
  uint64_t capacity_bytes() const { return uint64_t{frame_bytes_} * frame_count(); }
  // Bytes of frames in use (allocated), for metrics.
  uint64_t used_bytes() const { return uint64_t{frame_bytes_} * allocator_->used(); }

  FrameAllocator& allocator() const { return *allocator_; }

  // Precondition: frame < frame_count().
  std::byte* frame_address(uint32_t frame) const {
    return base_ + std::size_t{frame} * frame_bytes_;
  }
  Result<std::byte*> checked_frame_address(uint32_t frame) const;
  // The frame holding `addr` when it lies inside this arena.
  Result<uint32_t> frame_of(const void* addr) const;

  std::byte* base() const { return base_; }
  std::size_t region_bytes() const { return std::size_t{frame_bytes_} * frame_count(); }
  int numa_node() const { return numa_node_; }  // -1: not placed
  bool memory_locked() const { return locked_; }

  Status audit() const { return allocator_->audit(); }

 protected:
  // The region and how to give it back; `release` runs once, in the destructor.
  struct Region {
    std::byte* base = nullptr;  // kFrameAlignment-aligned
    std::size_t bytes = 0;
    std::function<void()> release;
  };

  FrameArena(Tier tier, std::string backend, bool device_memory, const PageFormat& format,
             Region region, std::unique_ptr<FrameAllocator> allocator, int numa_node, bool locked);

  // Obtains a region for as many of `frames` as `try_map` grants: on kResourceExhausted it halves
  // the request until one frame is left, then gives up. One log line tells what was obtained when
  // it is less than asked. Returns the region and sets `frames` to its frame count.
  static Result<Region> map_with_backoff(std::string_view what, uint32_t& frames,
                                         std::size_t stride,
                                         const std::function<Result<Region>(std::size_t)>& try_map);

 private:
  const Tier tier_;
  const std::string backend_;
  const bool device_memory_;
  const PageFormat format_;
  const std::size_t frame_bytes_;
  Region region_;
  std::byte* base_;
  std::unique_ptr<FrameAllocator> allocator_;
  const int numa_node_;
  const bool locked_;
};

}  // namespace kvtier
