// HostMemoryApi: the seam for host memory the tiers map, pin and place on NUMA nodes.
//
// The host pool and the emulated HBM arena get their bytes through this interface (mmap with or
// without 2 MiB huge pages, mlock, madvise, hwloc NUMA binding), so tests can refuse any step —
// no huge pages, mlock not permitted, mmap failing above some size — and check that the tiers
// degrade (4 KiB pages, unlocked memory, fewer frames) with one log line instead of failing.
// `system_host_memory()` is the real one; its hwloc topology is loaded once, on first NUMA use.
// All methods are thread-safe; none holds a kvtier lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.hpp"

namespace kvtier {

class HostMemoryApi {
 public:
  virtual ~HostMemoryApi() = default;

  // An anonymous private mapping of `bytes` (a multiple of the page size asked for); `huge_2m`
  // asks the kernel for 2 MiB hugetlb pages (MAP_HUGETLB | MAP_HUGE_2MB).
  virtual Result<void*> map(std::size_t bytes, bool huge_2m) = 0;
  virtual void unmap(void* addr, std::size_t bytes) noexcept = 0;
  virtual Status lock(void* addr, std::size_t bytes) = 0;  // mlock: fault in and pin
  virtual void unlock(void* addr, std::size_t bytes) noexcept = 0;
  // Transparent huge pages for a 4 KiB mapping (MADV_HUGEPAGE): a hint, failure is harmless.
  virtual Status advise_huge(void* addr, std::size_t bytes) = 0;

  virtual int numa_nodes() = 0;  // >= 1
  // The OS indices of the NUMA nodes, ascending. Not always 0..numa_nodes()-1: ids can be sparse
  // (nodes 0 and 2, after hot-unplug or with memory-less nodes left out), so a configured node is
  // checked against these. The default is 0..numa_nodes()-1, for seams that only count nodes.
  virtual std::vector<int> numa_node_ids() {
    std::vector<int> ids(static_cast<std::size_t>(std::max(numa_nodes(), 1)));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    return ids;
  }
  // The NUMA node nearest a PCI device ("0000:3b:00.0"); kNotFound when the topology lacks it.
  virtual Result<int> numa_node_of_pci(const std::string& bus_id) = 0;
  // Binds pages of [addr, addr + bytes) not yet faulted in to `node` (OS index).
  virtual Status bind_area(void* addr, std::size_t bytes, int node) = 0;
  // Binds this thread's future allocations to `node`, for allocators we cannot hand an address
  // range to (cudaHostAlloc); unbind_thread restores the default policy.
  virtual Status bind_thread(int node) = 0;
  virtual void unbind_thread() noexcept = 0;
};

std::shared_ptr<HostMemoryApi> system_host_memory();

// "0, 2": node ids for messages.
std::string numa_node_list(const std::vector<int>& ids);

}  // namespace kvtier
