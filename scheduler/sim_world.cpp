// SimWorld assembly. See sim_world.hpp.
#include "scheduler/sim_world.hpp"

#include <algorithm>
#include <string>

namespace kvtier {

Result<std::unique_ptr<SimWorld>> SimWorld::create(const SimWorldSpec& spec) {
  if (spec.hbm_frames == 0) return invalid_argument("the simulated HBM tier has no frames");
  std::unique_ptr<SimWorld> w(new SimWorld(spec));
  KVTIER_ASSIGN_OR_RETURN(w->hbm_, FrameAllocator::create(spec.hbm_frames));
  KVTIER_ASSIGN_OR_RETURN(w->host_, FrameAllocator::create(spec.host_frames));
  if (spec.nvme_extents > 0) {
    KVTIER_ASSIGN_OR_RETURN(
        w->nvme_, ExtentAllocator::create({spec.nvme_extents}, spec.geometry.block_bytes(), 0));
  }
  PageTableOptions pto;
  pto.layers = spec.geometry.layers;
  pto.shards = 16;
  pto.expected_blocks = spec.hbm_frames / std::max<uint32_t>(1, spec.geometry.layers) +
                        spec.host_frames / std::max<uint32_t>(1, spec.geometry.layers) +
                        std::min<uint64_t>(spec.nvme_extents, 1u << 20);
  KVTIER_ASSIGN_OR_RETURN(
      w->table_,
      PageTable::create(pto, TierAllocators{w->hbm_.get(), w->host_.get(), w->nvme_.get()}));
  SimLinkSpec links;
  links.links = spec.links;
  links.nvme_extents = spec.nvme_extents;
  links.host_page_bytes = tier_page_format(spec.geometry, spec.host_kv_dtype).page_bytes();
  links.nvme_page_bytes = tier_page_format(spec.geometry, spec.nvme_kv_dtype).page_bytes();
  w->port_ = std::make_unique<SimTransferPort>(w->loop_, spec.geometry, links);
  SchedulerOptions so;
  so.geometry = spec.geometry;
  so.policies = spec.policies;
  so.watermarks = spec.watermarks;
  so.nvme_write_pause = spec.nvme_write_pause;
  so.nvme_read_pause = spec.nvme_read_pause;
  so.max_inflight_bytes.fill(spec.max_inflight_bytes);
  SchedulerParts parts{w->table_.get(), w->port_.get(), &w->loop_,
                       w->hbm_.get(),   w->host_.get(), w->nvme_.get()};
  KVTIER_ASSIGN_OR_RETURN(w->scheduler_, Scheduler::create(parts, so));
  return w;
}

void SimWorld::audit_every(uint64_t events) {
  if (events == 0) {
    loop_.after_each_event({});
    return;
  }
  loop_.after_each_event([this, events, seen = uint64_t{0}]() mutable {
    if (++seen % events != 0 || !audit_failure_.ok()) return;
    audit_failure_ =
        scheduler_->audit().with_context("after event " + std::to_string(seen) + " (virtual time " +
                                         std::to_string(nanos_to_seconds(loop_.now())) + " s)");
  });
}

SimWorld::~SimWorld() {
  // The scheduler's pending callbacks live in the loop's heap; drop the scheduler first, then the
  // port and table it refers to (the loop's remaining events are destroyed unrun with the loop).
  // An audit failure no one asked for is the caller's to have read (audit_failure).
  audit_failure_.ignore();
  scheduler_.reset();
  port_.reset();
  table_.reset();
}

}  // namespace kvtier
