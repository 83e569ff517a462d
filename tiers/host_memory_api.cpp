#include "tiers/host_memory_api.hpp"

#include <hwloc.h>
#include <linux/mman.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "kvtier/log.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

// hwloc topologies, loaded on first use and kept for the process: one of CPUs and memory (cheap;
// node counts and binding), and one with PCI devices, loaded only to find a GPU's NUMA node on a
// machine with more than one node (PCI discovery reads sysfs and the PCI name database).
class Topology {
 public:
  static Topology& instance() {
    static Topology t(false);
    return t;
  }
  static Topology& with_pci() {
    static Topology t(true);
    return t;
  }
  hwloc_topology_t get() const { return topo_; }
  bool ok() const { return topo_ != nullptr; }

 private:
  explicit Topology(bool pci) {
    if (hwloc_topology_init(&topo_) != 0) {
      topo_ = nullptr;
      return;
    }
    if (pci) hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo_) != 0) {
      hwloc_topology_destroy(topo_);
      topo_ = nullptr;
    }
  }
  ~Topology() {
    if (topo_ != nullptr) hwloc_topology_destroy(topo_);
  }
  hwloc_topology_t topo_ = nullptr;
};

class NodeSet {
 public:
  NodeSet() : set_(hwloc_bitmap_alloc()) {}
  ~NodeSet() { hwloc_bitmap_free(set_); }
  NodeSet(const NodeSet&) = delete;
  NodeSet& operator=(const NodeSet&) = delete;
  hwloc_bitmap_t get() const { return set_; }

 private:
  hwloc_bitmap_t set_;
};

class SystemHostMemory final : public HostMemoryApi {
 public:
  Result<void*> map(std::size_t bytes, bool huge_2m) override {
    // No MAP_NORESERVE: with it a hugetlb mapping "succeeds" without pages and the first touch
    // raises SIGBUS; without it the kernel reserves the pages now or says ENOMEM now.
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    if (huge_2m) flags |= MAP_HUGETLB | MAP_HUGE_2MB;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
      return errno_status(StatusCode::kResourceExhausted,
                          std::string("mmap ") + std::to_string(bytes) + " bytes" +
                              (huge_2m ? " with 2 MiB huge pages" : ""),
                          errno);
    }
    return p;
  }
  void unmap(void* addr, std::size_t bytes) noexcept override {
    if (::munmap(addr, bytes) != 0) {
      log(LogLevel::kWarn, "munmap " + std::to_string(bytes) + " bytes: " + errno_text(errno));
    }
  }
  Status lock(void* addr, std::size_t bytes) override {
    if (::mlock(addr, bytes) != 0) {
      return errno_status(StatusCode::kUnavailable, "mlock " + std::to_string(bytes) + " bytes",
                          errno);
    }
    return Status();
  }
  void unlock(void* addr, std::size_t bytes) noexcept override { ::munlock(addr, bytes); }
  Status advise_huge(void* addr, std::size_t bytes) override {
    if (::madvise(addr, bytes, MADV_HUGEPAGE) != 0) {
      return errno_status(StatusCode::kUnavailable, "madvise(MADV_HUGEPAGE)", errno);
    }
    return Status();
  }

  int numa_nodes() override {
    auto& t = Topology::instance();
    if (!t.ok()) return 1;
    const int n = hwloc_get_nbobjs_by_type(t.get(), HWLOC_OBJ_NUMANODE);
    return n > 0 ? n : 1;
  }

  std::vector<int> numa_node_ids() override {
    auto& t = Topology::instance();
    std::vector<int> ids;
    if (t.ok()) {
      hwloc_obj_t node = nullptr;
      while ((node = hwloc_get_next_obj_by_type(t.get(), HWLOC_OBJ_NUMANODE, node)) != nullptr) {
        ids.push_back(static_cast<int>(node->os_index));
      }
    }
    if (ids.empty()) ids.push_back(0);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  Result<int> numa_node_of_pci(const std::string& bus_id) override {
    auto& t = Topology::with_pci();
    if (!t.ok()) return not_found("hwloc topology unavailable");
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t.get(), bus_id.c_str());
    if (dev == nullptr) return not_found("PCI device " + bus_id + " not in the hwloc topology");
    hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(t.get(), dev);
    if (parent == nullptr || parent->nodeset == nullptr) {
      return not_found("PCI device " + bus_id + " has no NUMA locality");
    }
    const int first = hwloc_bitmap_first(parent->nodeset);
    if (first < 0) return not_found("PCI device " + bus_id + " has no NUMA locality");
    return first;
  }

  Status bind_area(void* addr, std::size_t bytes, int node) override {
    NodeSet set;
    KVTIER_RETURN_IF_ERROR(node_set(node, set));
    if (hwloc_set_area_membind(Topology::instance().get(), addr, bytes, set.get(),
                               HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) != 0) {
      return errno_status(
          StatusCode::kUnavailable,
          "bind " + std::to_string(bytes) + " bytes to NUMA node " + std::to_string(node), errno);
    }
    return Status();
  }

  Status bind_thread(int node) override {
    NodeSet set;
    KVTIER_RETURN_IF_ERROR(node_set(node, set));
    if (hwloc_set_membind(Topology::instance().get(), set.get(), HWLOC_MEMBIND_BIND,
                          HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0) {
      return errno_status(StatusCode::kUnavailable,
                          "bind this thread's memory to NUMA node " + std::to_string(node), errno);
    }
    return Status();
  }

  void unbind_thread() noexcept override {
    auto& t = Topology::instance();
    if (!t.ok()) return;
    hwloc_const_nodeset_t all = hwloc_topology_get_complete_nodeset(t.get());
    hwloc_set_membind(t.get(), all, HWLOC_MEMBIND_DEFAULT,
                      HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  }

 private:
  Status node_set(int node, NodeSet& set) {
    auto& t = Topology::instance();
    if (!t.ok()) return unavailable("hwloc topology unavailable");
    hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(t.get(), static_cast<unsigned>(node));
    if (obj == nullptr) {
      return invalid_argument("NUMA node " + std::to_string(node) +
                              " does not exist (nodes: " + numa_node_list(numa_node_ids()) + ")");
    }
    hwloc_bitmap_only(set.get(), static_cast<unsigned>(node));
    return Status();
  }
};

}  // namespace

std::string numa_node_list(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) {
    if (!out.empty()) out += ", ";
    out += std::to_string(id);
  }
  return out;
}

std::shared_ptr<HostMemoryApi> system_host_memory() {
  static const std::shared_ptr<HostMemoryApi> api = std::make_shared<SystemHostMemory>();
  return api;
}

}  // namespace kvtier
