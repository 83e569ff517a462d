#include "tiers/host_pool.hpp"

#include <algorithm>
#include <vector>

#include "kvtier/log.hpp"

namespace kvtier {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// The node to place the pool on: the configured one, else the GPU's, else none (-1).
Result<int> choose_node(const HostTierConfig& config, DeviceApi* device, HostMemoryApi& memory) {
  if (config.numa_node >= 0) {
    const std::vector<int> ids = memory.numa_node_ids();
    if (std::find(ids.begin(), ids.end(), config.numa_node) == ids.end()) {
      return invalid_argument(
          "tiers.host.numa_node " + std::to_string(config.numa_node) +
          " does not exist (this machine's NUMA node(s): " + numa_node_list(ids) + "; -1 = auto)");
    }
    return config.numa_node;
  }
  if (device == nullptr || memory.numa_nodes() <= 1) return -1;
  auto bus = device->pci_bus_id();
  if (!bus.ok()) {
    log_once(LogLevel::kInfo, "tiers.host.numa",
             "host pool not NUMA-placed: " + bus.status().message());
    return -1;
  }
  auto node = memory.numa_node_of_pci(*bus);
  if (!node.ok()) {
    log_once(LogLevel::kInfo, "tiers.host.numa",
             "host pool not NUMA-placed: " + node.status().message());
    return -1;
  }
  return *node;
}

}  // namespace

Result<std::unique_ptr<HostPool>> HostPool::create(const HostTierConfig& config,
                                                   const Geometry& geometry,
                                                   std::shared_ptr<DeviceApi> device,
                                                   std::shared_ptr<HostMemoryApi> memory) {
  return create(config, PageFormat::as_computed(geometry), std::move(device), std::move(memory));
}

Result<std::unique_ptr<HostPool>> HostPool::create(const HostTierConfig& config,
                                                   const PageFormat& format,
                                                   std::shared_ptr<DeviceApi> device,
                                                   std::shared_ptr<HostMemoryApi> memory) {
  if (!memory) return invalid_argument("tiers.host: no host memory interface");
  if (format.page_bytes() == 0) return invalid_argument("tiers.host: geometry has empty pages");
  const std::size_t stride = frame_stride(format);
  const uint64_t wanted = config.capacity_bytes / stride;
  if (wanted > FrameAllocator::kMaxFrames) {
    return invalid_argument("tiers.host.capacity_bytes " + std::to_string(config.capacity_bytes) +
                            " is more than " + std::to_string(FrameAllocator::kMaxFrames) +
                            " frames");
  }
  KVTIER_ASSIGN_OR_RETURN(const int node, choose_node(config, device.get(), *memory));

  uint32_t frames = static_cast<uint32_t>(wanted);
  std::string backend;
  bool locked = false;
  Region region;
  bool have_region = frames == 0;

  if (device && frames > 0) {
    bool bound = false;
    if (node >= 0) {
      Status b = memory->bind_thread(node);
      bound = b.ok();
      if (!bound) log_once(LogLevel::kInfo, "tiers.host.numa", "host pool: " + b.to_string());
    }
    uint32_t n = frames;
    auto mapped = map_with_backoff(
        "tiers.host (cudaHostAlloc)", n, stride, [&](std::size_t bytes) -> Result<Region> {
          auto buffer = DeviceBuffer::allocate(device, DeviceBuffer::Kind::kPinned, bytes);
          if (!buffer.ok()) return std::move(buffer).status();
          auto owned = std::make_shared<DeviceBuffer>(std::move(buffer).value());
          return Region{static_cast<std::byte*>(owned->get()), bytes,
                        [owned]() mutable { owned->reset(); }};
        });
    if (bound) memory->unbind_thread();
    if (mapped.ok()) {
      region = std::move(mapped).value();
      frames = n;
      backend = "cuda_pinned";
      locked = true;
      have_region = true;
    } else {
      log(LogLevel::kWarn, "tiers.host: pinned allocation refused (" + mapped.status().to_string() +
                               "); falling back to mmap, copies from it will be slower");
    }
  }

  if (!have_region) {
    bool huge = config.huge_pages;
    auto mapped = map_with_backoff(
        "tiers.host (mmap)", frames, stride, [&](std::size_t bytes) -> Result<Region> {
          if (huge) {
            const std::size_t huge_bytes = round_up(bytes, kHugePage);
            auto p = memory->map(huge_bytes, true);
            if (p.ok()) {
              void* addr = *p;
              return Region{static_cast<std::byte*>(addr), bytes,
                            [memory, addr, huge_bytes] { memory->unmap(addr, huge_bytes); }};
            }
            log_once(LogLevel::kInfo, "tiers.host.hugetlb",
                     "tiers.host: no 2 MiB huge pages (" + p.status().message() +
                         "); using 4 KiB pages with transparent huge pages requested");
            huge = false;
          }
          auto p = memory->map(bytes, false);
          if (!p.ok()) return std::move(p).status();
          memory->advise_huge(*p, bytes).ignore();  // a hint only
          void* addr = *p;
          return Region{static_cast<std::byte*>(addr), bytes,
                        [memory, addr, bytes] { memory->unmap(addr, bytes); }};
        });
    if (!mapped.ok()) return std::move(mapped).status();
    region = std::move(mapped).value();
    backend = huge ? "mmap_2m" : "mmap_4k";
    if (node >= 0 && frames > 0) {
      Status b = memory->bind_area(region.base, region.bytes, node);
      if (!b.ok()) log_once(LogLevel::kInfo, "tiers.host.numa", "host pool: " + b.to_string());
    }
    if (config.lock_memory && frames > 0) {
      Status l = memory->lock(region.base, region.bytes);
      if (l.ok()) {
        locked = true;
        auto release = std::move(region.release);
        std::byte* base = region.base;
        const std::size_t bytes = region.bytes;
        region.release = [memory, base, bytes, release = std::move(release)] {
          memory->unlock(base, bytes);
          release();
        };
      } else {
        log_once(LogLevel::kInfo, "tiers.host.mlock",
                 "tiers.host: memory not locked (" + l.message() +
                     "); pages may be swapped out under memory pressure");
      }
    }
  }

  KVTIER_ASSIGN_OR_RETURN(auto allocator, FrameAllocator::create(frames));
  return std::unique_ptr<HostPool>(new HostPool(Tier::kHost, std::move(backend), false, format,
                                                std::move(region), std::move(allocator), node,
                                                locked));
}

}  // namespace kvtier
