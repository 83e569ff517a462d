// Helpers shared by the page-table tests, the model test and the fuzz target: deterministic keys
// and a bundle of allocators with the table that uses them (declared in destruction-safe order).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "scheduler/page_table.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier::pt_test {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A content key (non-zero namespace tag) derived from `i`; distinct for distinct i.
inline BlockKey content_key(uint64_t i) {
  constexpr uint64_t kTag = 0x5A17ull << 48;
  return BlockKey{splitmix64(i), (splitmix64(i ^ 0xA5A5A5A5ull) & ~(0xFFFFull << 48)) | kTag};
}

struct TableRig {
  std::unique_ptr<FrameAllocator> hbm;
  std::unique_ptr<FrameAllocator> host;
  std::unique_ptr<ExtentAllocator> nvme;
  std::unique_ptr<PageTable> table;  // last: destroyed first, while the allocators still exist

  // Capacities in frames (HBM, host) and extents (NVMe); nvme_extents < 0 leaves NVMe unconfigured.
  static Result<TableRig> make(uint32_t layers, uint32_t shards, uint32_t hbm_frames,
                               uint32_t host_frames, int64_t nvme_extents) {
    TableRig rig;
    KVTIER_ASSIGN_OR_RETURN(rig.hbm, FrameAllocator::create(hbm_frames));
    KVTIER_ASSIGN_OR_RETURN(rig.host, FrameAllocator::create(host_frames));
    if (nvme_extents >= 0) {
      KVTIER_ASSIGN_OR_RETURN(
          rig.nvme, ExtentAllocator::create({static_cast<uint32_t>(nvme_extents)}, 1 << 20, 4096));
    }
    TierAllocators allocators{rig.hbm.get(), rig.host.get(), rig.nvme.get()};
    PageTableOptions options;
    options.layers = layers;
    options.shards = shards;
    KVTIER_ASSIGN_OR_RETURN(rig.table, PageTable::create(options, allocators));
    return rig;
  }

  uint32_t used(Tier t) const {
    switch (t) {
      case Tier::kHbm: return hbm->used();
      case Tier::kHost: return host->used();
      case Tier::kNvme: return nvme ? nvme->used() : 0;
    }
    return 0;
  }
};

}  // namespace kvtier::pt_test
