// The virtual-clock engine. See sim_engine.hpp.
#include "bench/run/sim_engine.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/run/batcher.hpp"
#include "runtime/metrics_exporter.hpp"
#include "scheduler/sim_world.hpp"

namespace kvtier::bench::run {
namespace {

constexpr Nanos kForever = std::numeric_limits<Nanos>::max();
// Longest a request waits out of the batch for its prefix to leave NVMe before it runs anyway
// (and stalls the step on what is still loading).
constexpr Nanos kMaxHold = 5 * kNanosPerSecond;

// Drives one SimWorld through a workload: the Batcher decides what runs, this class runs it in
// virtual time.
class Engine {
 public:
  Engine(const Workload& workload, const BaselineSpec& baseline, const PerfModel& model,
         const VirtualRunOptions& options, SimWorld& world, BaselineResult& result)
      : baseline_(baseline),
        model_(model),
        options_(options),
        sched_(world.scheduler()),
        loop_(world.loop()),
        table_(world.table()),
        result_(result),
        batcher_(workload, batcher_config(model, baseline, world), result, options.progress) {}

  Status run() {
    const OpenFn open = [this](std::span<const BlockKey> keys) {
      return sched_.open_sequence(keys);
    };
    const auto close = [this](SequenceId id, uint64_t generated) {
      return sched_.close_sequence(id, generated);
    };
    // A request may run once none of its reused blocks is only on NVMe any more.
    const auto ready = [this](const LiveRequest& r) {
      const auto keys = std::span(r.req->keys).first(r.reused_blocks);
      const MatchResult m =
          table_.match(keys, MatchOptions{.record_hits = false, .acquire = false});
      return m.blocks < keys.size() || m.by_tier[tier_index(Tier::kNvme)] == 0;
    };
    while (!batcher_.finished()) {
      if (options_.cancel != nullptr && options_.cancel->load(std::memory_order_relaxed)) {
        return cancelled("run of " + baseline_.name + " cancelled");
      }
      batcher_.take_arrivals(loop_.now());
      KVTIER_RETURN_IF_ERROR(batcher_.admit(open, loop_.now()));
      if (baseline_.hints && batcher_.hints_dirty()) {
        const auto hinted =
            batcher_.hints(loop_.now(), model_.prefill_tokens_per_s(), options_.hint_window);
        KVTIER_RETURN_IF_ERROR(sched_.hint(hinted).with_context("hint"));
      }
      if (batcher_.idle()) {
        if (batcher_.has_waiting()) continue;  // admission rejected the head; look again
        const auto next = batcher_.next_arrival();
        if (!next) break;
        loop_.run_until(*next);
        continue;
      }
      if (batcher_.hold(ready, loop_.now(), kMaxHold) == 0) {
        // Every admitted request waits for its prefix to come up from NVMe: let time pass until
        // the next event (a transfer completing) or arrival.
        const Nanos until =
            std::min(batcher_.next_arrival().value_or(kForever), loop_.now() + kMaxHold);
        const Nanos event = loop_.next_event_time();
        if (event >= 0 && event <= until) {
          loop_.run_one();
        } else {
          loop_.run_until(until);
        }
        continue;
      }
      KVTIER_RETURN_IF_ERROR(step(close));
    }
    return ok_status();
  }

 private:
  static BatcherConfig batcher_config(const PerfModel& model, const BaselineSpec& baseline,
                                      const SimWorld& world) {
    BatcherConfig c;
    c.page_tokens = world.spec().geometry.page_tokens;
    c.layers = world.spec().geometry.layers;
    c.hbm_frames = world.spec().hbm_frames;
    c.host_frames = world.spec().host_frames;
    c.admit_fraction = model.gpu().kv_admit_fraction;
    c.max_sequences = model.gpu().max_sequences;
    c.max_batched_tokens = model.gpu().max_batched_tokens;
    c.reuse = baseline.reuse;
    c.hold_nvme = true;
    return c;
  }

  Status step(const std::function<Status(SequenceId, uint64_t)>& close) {
    const Nanos now = loop_.now();
    const uint32_t max_iterations =
        batcher_.windowed_batch() ? 1 : std::max<uint32_t>(1, model_.gpu().max_step_iterations);
    StepPlan plan = batcher_.plan(
        now, max_iterations, [this](const IterationWork& w) { return model_.iteration_time(w); });
    if (plan.items.empty()) return internal_error("a step planned no work with requests running");
    for (const IterationWork& w : plan.iterations) plan.prefill_time += model_.prefill_time(w);
    auto info = sched_.begin_step(plan.items);
    if (!info.ok())
      return info.status().with_context("begin_step at t=" + std::to_string(now) + " ns");
    KVTIER_ASSIGN_OR_RETURN(IterationWork late, batcher_.accept(plan, *info));
    // Prompt tokens the scheduler gave back (late loads) are computed before the first iteration.
    const Nanos extra = late.prefill_tokens > 0 ? model_.prefill_time(late) : 0;
    const Nanos compute = plan.model_time + extra;
    Nanos stall = 0;
    for (uint32_t l = 0; l < info->layers; ++l) {
      auto ready = sched_.layer_readiness(info->id, l);
      if (!ready.ok()) return ready.status().with_context("step " + std::to_string(info->id));
      const Nanos before = loop_.now();
      const bool finished = loop_.run_while_not([&] { return (*ready)->finished(); });
      stall += loop_.now() - before;
      if (!finished) {
        const std::string pending = sched_.pending_summary();
        sched_.abort_step(info->id).ignore();
        return internal_error(
            "layer " + std::to_string(l) + " of step " + std::to_string(info->id) +
            " never became ready: the simulation ran out of events (" + baseline_.name +
            ", t=" + std::to_string(loop_.now()) + " ns; scheduler: " + pending + ")");
      }
      Status w = (*ready)->wait(0);
      if (!w.ok()) {
        sched_.abort_step(info->id).ignore();
        return w.with_context("layer " + std::to_string(l) + " of step " +
                              std::to_string(info->id));
      }
      // Layers share the step's compute evenly; the last takes the rounding.
      const Nanos per_layer = compute / info->layers;
      const Nanos mine =
          l + 1 == info->layers ? compute - per_layer * (info->layers - 1) : per_layer;
      loop_.run_until(loop_.now() + mine);
      KVTIER_RETURN_IF_ERROR(sched_.end_layer(info->id, l).with_context("end_layer"));
    }
    const auto completions = batcher_.completions(plan, *info);
    KVTIER_RETURN_IF_ERROR(sched_.end_step(info->id, completions).with_context("end_step"));
    result_.stall_ns += stall;
    result_.compute_ns += compute;
    result_.prefill_gpu_ns += plan.prefill_time + extra;
    result_.prefill_tokens += plan.prefill_tokens + late.prefill_tokens;
    result_.steps += 1;
    if (info->windowed) result_.windowed_steps += 1;
    return batcher_.complete(plan, loop_.now(), close);
  }

  const BaselineSpec& baseline_;
  const PerfModel& model_;
  const VirtualRunOptions& options_;
  Scheduler& sched_;
  SimEventLoop& loop_;
  PageTable& table_;
  BaselineResult& result_;
  Batcher batcher_;
};

// What a Runtime's exporter reads, taken from a simulated world: its scheduler's counters, its
// links' TransferStats and the occupancy of its allocators (frames of page_bytes, extents of
// block_bytes). A tier the world lacks gets no probe, so its series are absent.
MetricsSources sim_metrics_sources(SimWorld& world) {
  MetricsSources m;
  m.scheduler = &world.scheduler().stats();
  m.transfer = &world.port().transfer_stats();
  const Geometry& g = world.spec().geometry;
  const auto frames = [page = g.page_bytes()](const FrameAllocator* a) -> OccupancyProbe {
    return [a, page] {
      return TierOccupancy{uint64_t{a->used()} * page, uint64_t{a->capacity()} * page};
    };
  };
  m.occupancy[tier_index(Tier::kHbm)] = frames(&world.hbm());
  if (world.spec().host_frames > 0) m.occupancy[tier_index(Tier::kHost)] = frames(&world.host());
  if (const ExtentAllocator* nvme = world.nvme(); nvme != nullptr) {
    m.occupancy[tier_index(Tier::kNvme)] = [nvme, block = g.block_bytes()] {
      return TierOccupancy{uint64_t{nvme->used()} * block, uint64_t{nvme->in_service()} * block};
    };
  }
  return m;
}

uint32_t frames_of(uint64_t bytes, uint64_t frame_bytes) {
  return static_cast<uint32_t>(std::min<uint64_t>(bytes / frame_bytes, FrameAllocator::kMaxFrames));
}

}  // namespace

Result<BaselineResult> run_virtual(const Workload& workload, const BaselineSpec& baseline,
                                   const PerfModel& model, const VirtualRunOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  const Geometry& g = model.sim_geometry();
  if (workload.page_tokens != g.page_tokens) {
    return invalid_argument("workload " + workload.name + " was built at " +
                            std::to_string(workload.page_tokens) +
                            " tokens per block, the model at " + std::to_string(g.page_tokens));
  }
  const GpuPreset& gpu = model.gpu();
  SimWorldSpec spec;
  spec.geometry = g;
  spec.hbm_frames = frames_of(options.hbm_kv_bytes, g.page_bytes());
  // Host frames hold pages in the host tier's format: fp8 fits about twice as many.
  const uint64_t host_page_bytes = tier_page_format(g, options.host_kv_dtype).page_bytes();
  spec.host_frames = baseline.host ? frames_of(options.host_bytes, host_page_bytes) : 0;
  const uint64_t nvme_block_bytes = tier_page_format(g, options.nvme_kv_dtype).block_bytes();
  spec.nvme_extents = baseline.nvme ? frames_of(options.nvme_bytes, nvme_block_bytes) : 0;
  spec.host_kv_dtype = options.host_kv_dtype;
  spec.nvme_kv_dtype = options.nvme_kv_dtype;
  const auto link = [](double bytes_per_s, double latency_us) {
    return LinkModel{bytes_per_s, static_cast<Nanos>(latency_us * 1e3)};
  };
  const double pcie = gpu.pcie_bandwidth * gpu.pcie_efficiency;
  spec.links[static_cast<int>(Link::kHostToHbm)] = link(pcie, gpu.pcie_latency_us);
  spec.links[static_cast<int>(Link::kHbmToHost)] = link(pcie, gpu.pcie_latency_us);
  spec.links[static_cast<int>(Link::kNvmeToHost)] =
      link(gpu.nvme_read_bandwidth * gpu.nvme_efficiency, gpu.nvme_latency_us);
  spec.links[static_cast<int>(Link::kHostToNvme)] =
      link(gpu.nvme_write_bandwidth * gpu.nvme_efficiency, gpu.nvme_latency_us);
  spec.policies = baseline.policies;
  spec.watermarks = options.watermarks;
  KVTIER_ASSIGN_OR_RETURN(auto world, SimWorld::create(spec));

  BaselineResult result;
  result.name = baseline.name;
  result.summary = baseline.summary;
  result.clock = "virtual";
  result.tier_bytes[tier_index(Tier::kHbm)] =
      static_cast<uint64_t>(spec.hbm_frames) * g.page_bytes();
  result.tier_bytes[tier_index(Tier::kHost)] =
      static_cast<uint64_t>(spec.host_frames) * host_page_bytes;
  result.tier_bytes[tier_index(Tier::kNvme)] =
      static_cast<uint64_t>(spec.nvme_extents) * nvme_block_bytes;
  std::unique_ptr<MetricsExporter> metrics;  // declared after the world: stops serving first
  if (!options.metrics.listen.empty()) {
    KVTIER_ASSIGN_OR_RETURN(metrics,
                            MetricsExporter::create(options.metrics, sim_metrics_sources(*world)));
  }
  world->audit_every(options.audit_every);
  Engine engine(workload, baseline, model, options, *world, result);
  KVTIER_RETURN_IF_ERROR(engine.run().with_context("baseline " + baseline.name));
  KVTIER_RETURN_IF_ERROR(
      world->audit_failure().with_context("baseline " + baseline.name + ": audit"));
  if (metrics != nullptr && metrics->serving() && options.metrics_hold_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options.metrics_hold_s));
  }

  const SchedulerStats& s = world->scheduler().stats();
  for (Link l : kAllLinks) {
    const SimLinkCounters& c = world->port().counters(l);
    result.link_bytes[static_cast<int>(l)] = c.bytes;
    result.link_busy_s[static_cast<int>(l)] = nanos_to_seconds(c.busy);
  }
  for (Tier t : kAllTiers) {
    const int i = tier_index(t);
    result.promotions[i] = s.promotions[i].load();
    result.demotions[i] = s.demotions[i].load();
    result.evictions[i] = s.evictions[i].load();
    result.hinted_loads[i] = s.hinted_loads[i].load();
    result.hinted_loads_reused[i] = s.hinted_loads_reused[i].load();
  }
  result.prefetches = s.prefetches.load();
  result.late_prefetches = s.late_prefetches.load();
  result.recompute_tokens = s.recompute_tokens.load();
  result.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

}  // namespace kvtier::bench::run
