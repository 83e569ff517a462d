// A scheduler over modeled tiers in virtual time (kvtier::SimWorld, what the benchmark runs), and a
// simulated engine that drives it: the fixture of the deterministic scheduler tests. Everything
// runs on the test's thread; time moves only when the SimEventLoop runs events.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "scheduler/page_table.hpp"
#include "scheduler/scheduler.hpp"
#include "scheduler/sim_event_loop.hpp"
#include "scheduler/sim_transfer_port.hpp"
#include "scheduler/sim_world.hpp"
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
  TierKvDtype host_kv_dtype = TierKvDtype::kModel;
  TierKvDtype nvme_kv_dtype = TierKvDtype::kModel;
  PoliciesConfig policies;
  std::array<Watermarks, kNumTiers> watermarks{Watermarks{0.9, 1.0}, Watermarks{0.9, 1.0},
                                               Watermarks{0.9, 1.0}};
  uint64_t max_inflight_bytes = 64ull << 20;  // per link
  NvmePauseOptions nvme_write_pause;
  NvmePauseOptions nvme_read_pause;
  // Virtual time the engine spends between a step's last end_layer and its end_step (sampling),
  // the loop running meanwhile; unset: end_step follows at once.
  std::optional<Nanos> sampling_time;
};

class SimWorld {
 public:
  // Events a settle, or a wait for one layer, may run: far more than any test's workload needs,
  // few enough that a livelock fails in seconds.
  static constexpr uint64_t kMaxSettleEvents = 200'000;

  explicit SimWorld(const SimSetup& setup) : setup_(setup) {
    kvtier::SimWorldSpec spec;
    spec.geometry = setup.geometry;
    spec.hbm_frames = setup.hbm_frames;
    spec.host_frames = setup.host_frames;
    spec.nvme_extents = setup.nvme_extents;
    spec.host_kv_dtype = setup.host_kv_dtype;
    spec.nvme_kv_dtype = setup.nvme_kv_dtype;
    const auto link = [](double gbps) { return LinkModel{gbps * 1e9, 2 * kNanosPerMicro}; };
    spec.links[static_cast<int>(Link::kHostToHbm)] = link(setup.h2d_gbps);
    spec.links[static_cast<int>(Link::kHbmToHost)] = link(setup.d2h_gbps);
    spec.links[static_cast<int>(Link::kNvmeToHost)] = link(setup.nvme_read_gbps);
    spec.links[static_cast<int>(Link::kHostToNvme)] = link(setup.nvme_write_gbps);
    spec.policies = setup.policies;
    spec.watermarks = setup.watermarks;
    spec.nvme_write_pause = setup.nvme_write_pause;
    spec.nvme_read_pause = setup.nvme_read_pause;
    spec.max_inflight_bytes = setup.max_inflight_bytes;
    auto w = kvtier::SimWorld::create(spec);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    world_ = std::move(w).value();
    if (world_ != nullptr) world_->audit_every(1);  // see broken()
  }

  Scheduler& scheduler() { return world_->scheduler(); }
  PageTable& table() { return world_->table(); }
  SimEventLoop& loop() { return world_->loop(); }
  SimTransferPort& port() { return world_->port(); }
  const FrameAllocator& hbm() { return world_->hbm(); }
  const FrameAllocator& host() { return world_->host(); }
  const ExtentAllocator* nvme() { return world_->nvme(); }  // null: no NVMe tier
  const SimSetup& setup() const { return setup_; }
  // The first invariant broken between two of the loop's events ("" when none): in the runtime
  // an engine thread may look at the state at any such point, not only when the loop is idle.
  std::string broken() const {
    const Status& s = world_->audit_failure();
    return s.ok() ? "" : s.to_string();
  }
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
    Nanos stall = 0;    // virtual time the engine waited on layers
    Nanos compute = 0;  // virtual time the engine computed
    StepInfo info;
    std::vector<LayerTable> tables;
    // Frames that were not a valid, allocated HBM frame, distinct within the item's row, when the
    // engine read the layer (checked at that moment: windowed steps release frames as they go).
    uint32_t invalid_frames = 0;
  };

  // Runs one whole step the way an engine would: for each layer, wait for readiness (the loop runs
  // meanwhile), then compute for `compute_per_layer` of virtual time, then end the layer.
  StepResult run_step(std::span<const StepItem> batch, Nanos compute_per_layer,
                      std::span<const StepCompletion> completions = {}) {
    const std::vector<StepCompletion> given(completions.begin(), completions.end());
    return run_step(batch, compute_per_layer, [&given](const StepInfo&) { return given; });
  }
  // The same, with the completions end_step is given made from what begin_step said (a step that
  // recomputes a late prefix starts its blocks earlier than the engine's own count).
  using CompletionsOf = std::function<std::vector<StepCompletion>(const StepInfo&)>;
  StepResult run_step(std::span<const StepItem> batch, Nanos compute_per_layer,
                      const CompletionsOf& completions_of) {
    StepResult r;
    auto info = scheduler().begin_step(batch);
    if (!info.ok()) {
      r.status = info.status();
      return r;
    }
    r.info = *info;
    for (uint32_t l = 0; l < info->layers; ++l) {
      auto ready = scheduler().layer_readiness(info->id, l);
      if (!ready.ok()) {
        r.status = ready.status();
        return r;
      }
      const Nanos before = loop().now();
      const bool done =
          loop().run_while_not([&] { return (*ready)->finished(); }, kMaxSettleEvents);
      r.stall += loop().now() - before;
      // Once the simulation goes idle the layer cannot become ready: the readiness's own "not
      // ready" says less than that, so it is not asked; what the scheduler waits on is told, as
      // the runtime's wait_layer tells it. Events that never end are a livelock, and fail.
      Status w;
      if (done) {
        w = (*ready)->wait(0);
      } else if (loop().pending() == 0) {
        w = deadline_exceeded("layer never became ready (simulation idle); waiting on: " +
                              scheduler().pending_summary());
      } else {
        w = livelock("layer " + std::to_string(l) + " waited for");
      }
      if (!w.ok()) {
        r.status = w;
        scheduler().abort_step(info->id).ignore();
        return r;
      }
      auto t = scheduler().layer_table(info->id, l);
      EXPECT_TRUE(t.ok());
      if (t.ok()) {
        // Distinct within an item's row: items that share a block list its frame each.
        for (std::size_t item = 0; item + 1 < t->indptr.size(); ++item) {
          std::unordered_set<int32_t> seen;
          for (int32_t j = t->indptr[item]; j < t->indptr[item + 1]; ++j) {
            const int32_t f = t->indices[static_cast<std::size_t>(j)];
            if (f < 0 || !hbm().is_allocated(static_cast<uint32_t>(f)) || !seen.insert(f).second) {
              ++r.invalid_frames;
            }
          }
        }
        r.tables.push_back(*t);
      }
      if (loop().run_until(loop().now() + compute_per_layer, kMaxSettleEvents) ==
          kMaxSettleEvents) {
        r.status = livelock("layer " + std::to_string(l) + " computed for");
        scheduler().abort_step(info->id).ignore();
        return r;
      }
      r.compute += compute_per_layer;
      Status e = scheduler().end_layer(info->id, l);
      if (!e.ok()) {
        r.status = e;
        return r;
      }
    }
    if (setup_.sampling_time.has_value() &&
        loop().run_until(loop().now() + *setup_.sampling_time, kMaxSettleEvents) ==
            kMaxSettleEvents) {
      r.status = livelock("sampling");
      scheduler().abort_step(info->id).ignore();
      return r;
    }
    r.status = scheduler().end_step(info->id, completions_of(*info));
    return r;
  }

  // Opens a sequence over `keys`, runs one step writing `new_tokens` and closes it.
  Status step_and_close(std::span<const BlockKey> keys, uint32_t new_tokens,
                        Nanos compute_per_layer) {
    auto s = scheduler().open_sequence(keys);
    if (!s.ok()) return s.status();
    const StepItem item{s->id, new_tokens};
    Status step = run_step(std::span(&item, 1), compute_per_layer).status;
    Status closed = scheduler().close_sequence(s->id);
    if (!step.ok()) {
      closed.ignore();
      return step;
    }
    return closed;
  }
  // The same, computing (or reusing) every token of `keys`.
  Status prefill_and_close(std::span<const BlockKey> keys, Nanos compute_per_layer) {
    return step_and_close(keys, static_cast<uint32_t>(keys.size()) * setup_.geometry.page_tokens,
                          compute_per_layer);
  }

  // Opens a sequence and runs one step that writes `blocks` blocks it keeps private (no content
  // keys): they hold their HBM frames, and leave last (an open sequence's), until it closes.
  Result<SequenceId> hold_private_blocks(uint32_t blocks, Nanos compute_per_layer) {
    KVTIER_ASSIGN_OR_RETURN(OpenedSequence s, scheduler().open_sequence({}));
    const StepItem item{s.id, blocks * setup_.geometry.page_tokens};
    KVTIER_RETURN_IF_ERROR(run_step(std::span(&item, 1), compute_per_layer).status);
    return s.id;
  }

  // Computes `count` prompts of `blocks` blocks (prompt(blocks, 1), prompt(blocks, 2), ...) one
  // after another, each settled before the next; their keys go to `out`.
  Status compute_prompts(uint32_t count, uint32_t blocks, Nanos compute_per_layer,
                         std::vector<std::vector<BlockKey>>& out) {
    for (uint32_t p = 0; p < count; ++p) {
      out.push_back(prompt(blocks, p + 1));
      KVTIER_RETURN_IF_ERROR(prefill_and_close(out.back(), compute_per_layer));
      settle();
    }
    return ok_status();
  }

  // Opens `count` one-block prompts (prompt(1, 1), prompt(1, 2), ...) and computes each in a
  // step, settled before the next; their sequences stay open, their ids go to `open`.
  Status hold_prompts(uint32_t count, Nanos compute_per_layer, std::vector<SequenceId>& open) {
    for (uint32_t p = 0; p < count; ++p) {
      KVTIER_ASSIGN_OR_RETURN(OpenedSequence s, scheduler().open_sequence(prompt(1, p + 1)));
      open.push_back(s.id);
      const StepItem item{s.id, setup_.geometry.page_tokens};
      Status ran = run_step(std::span(&item, 1), compute_per_layer).status;
      if (!ran.ok()) return ran.with_context("prompt " + std::to_string(p));
      settle();
    }
    return ok_status();
  }

  // Runs the loop until no transfer is pending. Moves that keep starting each other (a livelock:
  // a block staged down and dropped again for ever) fail the test instead of hanging it.
  void settle() {
    if (loop().run_until_idle(kMaxSettleEvents) == kMaxSettleEvents && loop().pending() != 0) {
      livelock("the simulation ran without settling for").ignore();
    }
  }

 private:
  // Fails the test: `what` ran for kMaxSettleEvents events and the loop still has more. The
  // status says so, with what the scheduler waits on.
  Status livelock(const std::string& what) {
    Status s = deadline_exceeded(what + " " + std::to_string(kMaxSettleEvents) +
                                 " events (a livelock); pending: " + scheduler().pending_summary());
    ADD_FAILURE() << s.to_string();
    return s;
  }

  SimSetup setup_;
  std::unique_ptr<kvtier::SimWorld> world_;
};

// The page table passes its audit and every frame of HBM and host memory is used or free, now
// and (where the world audits every event) after every event the loop ran.
inline void expect_consistent(SimWorld& w) {
  EXPECT_EQ(w.broken(), "");
  Status audit = w.table().audit();
  EXPECT_TRUE(audit.ok()) << audit.to_string();
  Status members = w.scheduler().audit_membership();
  EXPECT_TRUE(members.ok()) << members.to_string();
  EXPECT_EQ(w.hbm().used() + w.hbm().free_count(), w.hbm().capacity());
  EXPECT_EQ(w.host().used() + w.host().free_count(), w.host().capacity());
}

// Closes `ids`, lets every move end, and checks that the table is consistent and the scheduler
// idle: how a test that leaves nothing open ends.
inline void close_and_expect_idle(SimWorld& w, std::span<const SequenceId> ids) {
  for (SequenceId id : ids) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}
inline void close_and_expect_idle(SimWorld& w, std::initializer_list<SequenceId> ids) {
  close_and_expect_idle(w, std::span(ids.begin(), ids.size()));
}

// A block some sequence references must keep every page somewhere (or have it on its way): the
// key and layer of the first that does not, or "".
inline std::string lost_page(SimWorld& w) {
  for (const auto& [key, info] : w.table().snapshot()) {
    // A failed NVMe read is the one way, and its sequences recompute the block.
    if (info.refcount == 0 || w.scheduler().lost_to_a_failed_read(key)) continue;
    if (info.nvme == CopyState::kReady || info.nvme == CopyState::kFilling) continue;
    for (std::size_t l = 0; l < info.pages.size(); ++l) {
      const PageInfo& p = info.pages[l];
      if (p.hbm == CopyState::kAbsent && p.host == CopyState::kAbsent) {
        return to_string(key) + " layer " + std::to_string(l);
      }
    }
  }
  return "";
}

// Every page listed for a layer was an allocated HBM frame, distinct within its item's row, when
// the engine read it, and the tables have one row per batch item.
inline void expect_tables_valid(SimWorld& w, const SimWorld::StepResult& r) {
  EXPECT_EQ(r.invalid_frames, 0u) << "a block table listed a frame that was not resident";
  for (const LayerTable& t : r.tables) ASSERT_EQ(t.indptr.size(), r.info.items.size() + 1);
}

// The tiers and policies of a random-workload seed: small HBM and host memory, NVMe smaller than
// the blocks open sequences hold on every fourth seed, and the eviction and write policies in turn.
inline SimSetup random_workload_setup(int seed) {
  SimSetup setup;
  setup.hbm_frames = 48;
  setup.host_frames = 96;
  setup.nvme_extents = seed % 4 == 3 ? 6 : 64;
  constexpr EvictionPolicy kEvictions[] = {EvictionPolicy::kLru, EvictionPolicy::kLfu,
                                           EvictionPolicy::kS3Fifo, EvictionPolicy::kPrefixAware,
                                           EvictionPolicy::kLookahead};
  setup.policies.eviction = kEvictions[seed % 5];
  constexpr WritePolicy kWrites[] = {WritePolicy::kWriteBack, WritePolicy::kWriteThrough,
                                     WritePolicy::kWriteThroughSelective};
  setup.policies.write = kWrites[seed % 3];
  return setup;
}

// A pause of NVMe writes or reads after `failures` in a row (0: never), `first` long at first and
// doubling up to `longest`.
inline NvmePauseOptions pause_after(uint32_t failures, Nanos first = 10 * kNanosPerMilli,
                                    Nanos longest = 40 * kNanosPerMilli) {
  NvmePauseOptions o;
  o.after_failures = failures;
  o.first_pause = first;
  o.longest_pause = longest;
  return o;
}

// For the random workloads' seeds that inject transfer failures: every failed NVMe write pauses
// writing there for a few milliseconds (a millisecond, doubling up to four), and every failed
// read reading, so the pauses, their ends, the steps they leave without room and the prompts
// that recompute what only NVMe holds happen often, among everything else.
inline void pause_nvme_at_every_failure(SimSetup& setup) {
  setup.nvme_write_pause = pause_after(1, kNanosPerMilli, 4 * kNanosPerMilli);
  setup.nvme_read_pause = setup.nvme_write_pause;
}

// For the same seeds, once per operation: one time in 24 the next NVMe write lands on a bad
// sector (it fails and its extent is retired, up to one in 32), one time in 24 the next NVMe
// read does (it fails, and the extent is retired when the block is erased), one time in 480
// a drive dies with about a quarter of the blocks on NVMe (the scheduler forgets them), one
// time in 480 a drive is readmitted: every extent retired so far is back in service (the
// scheduler puts them back in its table at its next step), one time in 48 the next NVMe read
// hangs (it fails, abandoned, and its host frames stay held) and one time in 48 the reads hung
// so far are answered (their frames are free again). `disk` is a generator of its own, so that
// the seed's operations and its other failures are drawn as they were. answer_hung_reads at the
// end frees what is still held.
inline void maybe_hit_a_failing_disk(SimWorld& w, std::mt19937& disk) {
  const uint32_t draw = disk() % 480;
  if (draw % 24 == 0) w.port().fail_next_writes_on_bad_extents(1);
  if (draw % 24 == 1) w.port().fail_next_read_on_a_bad_extent();
  if (draw == 2) w.port().lose_some_nvme_blocks(disk, 4);
  if (draw == 3) w.port().readmit_nvme_extents(w.port().nvme_retired_extents());
  if (draw % 48 == 4) w.port().hang_next_reads(1);
  if (draw % 48 == 5) w.port().answer_hung_reads();
}

}  // namespace kvtier::testing
