// SimWorld: kvtier's real scheduler, page table and policies over modeled tiers in virtual time —
// frame allocators sized like the modeled HBM, host and NVMe tiers, a SimTransferPort whose links
// have the modeled bandwidths, and a SimEventLoop. What the long-context benchmark runs each
// baseline in, and what the deterministic scheduler tests drive; it owns everything and tears it
// down in reverse order. Single-threaded: the engine that drives it runs on the
// loop's (its own) thread, so several worlds may run side by side on different threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/scheduler.hpp"
#include "scheduler/sim_event_loop.hpp"
#include "scheduler/sim_transfer_port.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {

struct SimWorldSpec {
  Geometry geometry;
  uint32_t hbm_frames = 0;
  uint32_t host_frames = 0;                         // 0: no host tier
  uint32_t nvme_extents = 0;                        // 0: no NVMe tier
  TierKvDtype host_kv_dtype = TierKvDtype::kModel;  // how host holds pages (what PCIe moves)
  TierKvDtype nvme_kv_dtype = TierKvDtype::kModel;  // how NVMe stores pages (what its links move)
  std::array<LinkModel, kNumLinks> links{};         // indexed by Link
  PoliciesConfig policies;
  std::array<Watermarks, kNumTiers> watermarks{};
  NvmePauseOptions nvme_write_pause;  // when failed NVMe writes pause writing there
  NvmePauseOptions nvme_read_pause;   // and failed reads reading
  // Per link (SchedulerOptions::max_inflight_bytes). As the Runtime's: deep enough to keep a
  // link busy, shallow enough that a demand load is never behind more than a few milliseconds of
  // background work.
  uint64_t max_inflight_bytes = 64ull << 20;
};

class SimWorld {
 public:
  static Result<std::unique_ptr<SimWorld>> create(const SimWorldSpec& spec);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  Scheduler& scheduler() { return *scheduler_; }
  SimEventLoop& loop() { return loop_; }
  SimTransferPort& port() { return *port_; }
  PageTable& table() { return *table_; }
  const FrameAllocator& hbm() const { return *hbm_; }
  const FrameAllocator& host() const { return *host_; }
  const ExtentAllocator* nvme() const { return nvme_.get(); }  // null: no NVMe tier
  const SimWorldSpec& spec() const { return spec_; }
  // Runs Scheduler::audit after every `events`th event of the loop (0: never) and keeps the first
  // failure, naming the event and the virtual time: the invariants must hold between any two of
  // the loop's tasks, where an engine thread of the runtime may look, not only when it is idle.
  void audit_every(uint64_t events);
  // OK, or the first invariant an audit found broken.
  const Status& audit_failure() const { return audit_failure_; }

 private:
  explicit SimWorld(const SimWorldSpec& spec) : spec_(spec) {}

  SimWorldSpec spec_;
  std::unique_ptr<FrameAllocator> hbm_;
  std::unique_ptr<FrameAllocator> host_;
  std::unique_ptr<ExtentAllocator> nvme_;
  std::unique_ptr<PageTable> table_;
  SimEventLoop loop_;
  std::unique_ptr<SimTransferPort> port_;
  std::unique_ptr<Scheduler> scheduler_;
  Status audit_failure_;
};

}  // namespace kvtier
