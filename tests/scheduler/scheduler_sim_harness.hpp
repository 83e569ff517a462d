// A scheduler over modeled tiers in virtual time, and a simulated engine that drives it: the
// fixture of the deterministic scheduler tests. Everything runs on the test's thread; time moves
// only when the SimEventLoop runs events.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <unordered_set>
#include <vector>

#include "scheduler/page_table.hpp"
#include "scheduler/scheduler.hpp"
#include "scheduler/sim_event_loop.hpp"
#include "scheduler/sim_transfer_port.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier::testing {

struct SimSetup {
  Geometry geometry{/*layers=*/4, /*kv_heads=*/1, /*head_dim=*/64, Dtype::kBF16,
                    /*page_tokens=*/16};
  uint32_t hbm_frames = 64;
  uint32_t host_frames = 256;
  uint32_t nvme_extents = 256;
  double h2d_gbps = 10.0;  // GB/s
  double d2h_gbps = 10.0;
  double nvme_read_gbps = 2.0;
  double nvme_write_gbps = 1.0;
  PoliciesConfig policies;
  std::array<Watermarks, kNumTiers> watermarks{Watermarks{0.9, 1.0}, Watermarks{0.9, 1.0},
                                               Watermarks{0.9, 1.0}};
};

class SimWorld {
 public:
  explicit SimWorld(const SimSetup& setup) : setup_(setup) {
    hbm_ = std::move(FrameAllocator::create(setup.hbm_frames)).value();
    host_ = std::move(FrameAllocator::create(setup.host_frames)).value();
    if (setup.nvme_extents > 0) {
      nvme_ = std::move(ExtentAllocator::create({setup.nvme_extents},
                                                setup.geometry.block_bytes() + 4096, 4096))
                  .value();
    }
    PageTableOptions pto;
    pto.layers = setup.geometry.layers;
    pto.shards = 4;
    table_ = std::move(PageTable::create(pto, TierAllocators{hbm_.get(), host_.get(), nvme_.get()}))
                 .value();
    SimLinkSpec spec;
    const auto link = [](double gbps) { return LinkModel{gbps * 1e9, 2 * kNanosPerMicro}; };
    spec.links[static_cast<int>(Link::kHostToHbm)] = link(setup.h2d_gbps);
    spec.links[static_cast<int>(Link::kHbmToHost)] = link(setup.d2h_gbps);
    spec.links[static_cast<int>(Link::kNvmeToHost)] = link(setup.nvme_read_gbps);
    spec.links[static_cast<int>(Link::kHostToNvme)] = link(setup.nvme_write_gbps);
    spec.nvme_extents = setup.nvme_extents;
    port_ = std::make_unique<SimTransferPort>(loop_, setup.geometry, spec);
    SchedulerOptions so;
    so.geometry = setup.geometry;
    so.policies = setup.policies;
    so.watermarks = setup.watermarks;
    SchedulerParts parts{table_.get(), port_.get(), &loop_, hbm_.get(), host_.get(), nvme_.get()};
    auto s = Scheduler::create(parts, so);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    scheduler_ = std::move(s).value();
  }

  Scheduler& scheduler() { return *scheduler_; }
  PageTable& table() { return *table_; }
  SimEventLoop& loop() { return loop_; }
  SimTransferPort& port() { return *port_; }
  FrameAllocator& hbm() { return *hbm_; }
  FrameAllocator& host() { return *host_; }
  const SimSetup& setup() const { return setup_; }

  // Keys for a prompt of `blocks` full blocks; `salt` makes distinct prompts.
  std::vector<BlockKey> prompt(uint32_t blocks, uint32_t salt, uint32_t shared_prefix = 0) {
    std::vector<uint32_t> tokens(static_cast<std::size_t>(blocks) * setup_.geometry.page_tokens);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const bool shared = i < static_cast<std::size_t>(shared_prefix) * setup_.geometry.page_tokens;
      tokens[i] = static_cast<uint32_t>(i) * 7 + (shared ? 0 : salt * 100003u);
    }
    return chain_block_keys("sim", tokens, setup_.geometry.page_tokens);
  }

  struct StepResult {
    Status status;
    Nanos stall = 0;     // virtual time the engine waited on layers
    Nanos compute = 0;   // virtual time the engine computed
    StepInfo info;
    std::vector<LayerTable> tables;
    // Frames that were not a valid, distinct, allocated HBM frame when the engine read the layer
    // (checked at that moment: windowed steps release frames as they go).
    uint32_t invalid_frames = 0;
  };

  // Runs one whole step the way an engine would: for each layer, wait for readiness (the loop runs
  // meanwhile), then compute for `compute_per_layer` of virtual time, then end the layer.
  StepResult run_step(std::span<const StepItem> batch, Nanos compute_per_layer,
                      std::span<const StepCompletion> completions = {}) {
    StepResult r;
    auto info = scheduler_->begin_step(batch);
    if (!info.ok()) {
      r.status = info.status();
      return r;
    }
    r.info = *info;
    for (uint32_t l = 0; l < info->layers; ++l) {
      auto ready = scheduler_->layer_readiness(info->id, l);
      if (!ready.ok()) {
        r.status = ready.status();
        return r;
      }
      const Nanos before = loop_.now();
      const bool done = loop_.run_while_not([&] { return (*ready)->finished(); });
      r.stall += loop_.now() - before;
      Status w = (*ready)->wait(0);
      if (!done || !w.ok()) {
        r.status = done ? w : deadline_exceeded("layer never became ready (simulation idle)");
        scheduler_->abort_step(info->id).ignore();
        return r;
      }
      auto t = scheduler_->layer_table(info->id, l);
      EXPECT_TRUE(t.ok());
      if (t.ok()) {
        std::unordered_set<int32_t> seen;
        for (int32_t f : t->indices) {
          if (f < 0 || !hbm_->is_allocated(static_cast<uint32_t>(f)) || !seen.insert(f).second) {
            ++r.invalid_frames;
          }
        }
        r.tables.push_back(*t);
      }
      loop_.run_until(loop_.now() + compute_per_layer);
      r.compute += compute_per_layer;
      Status e = scheduler_->end_layer(info->id, l);
      if (!e.ok()) {
        r.status = e;
        return r;
      }
    }
    r.status = scheduler_->end_step(info->id, completions);
    return r;
  }

  // Runs the loop until no transfer is pending.
  void settle() { loop_.run_until_idle(); }

 private:
  SimSetup setup_;
  std::unique_ptr<FrameAllocator> hbm_;
  std::unique_ptr<FrameAllocator> host_;
  std::unique_ptr<ExtentAllocator> nvme_;
  std::unique_ptr<PageTable> table_;
  SimEventLoop loop_;
  std::unique_ptr<SimTransferPort> port_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace kvtier::testing
