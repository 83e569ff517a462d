// Runtime: the facade over tiers, page table, scheduler and metrics. See include/kvtier/kvtier.hpp.
//
// Construction order is dependency order and destruction runs in reverse: tiers (arenas, NVMe
// store, transfer engine) -> page table (allocating through the tiers' allocators, and through a
// "shadow" extent allocator sized like the NVMe store, whose extents are capacity tokens: the store
// itself places blocks, the page table counts them) -> event loop -> transfer port -> scheduler ->
// metrics. Engine calls that change the cache are marshalled onto the loop with run_sync (which
// runs them on the engine's thread when the loop is idle); waits and reads go straight to the
// scheduler's thread-safe parts. Calls that read the whole page table under every shard lock (the
// audit, the summary of a wait that timed out, shutdown's persisting) go to the loop's own thread
// (run_on_loop_thread): the caller's thread already holds a lock (the runtime's, shutdown's), and
// one more than the shards is more than ThreadSanitizer follows in one thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "kvtier/kvtier.hpp"
#include "kvtier/log.hpp"
#include "runtime/config_loader.hpp"
#include "runtime/config_validate.hpp"
#include "runtime/metrics_exporter.hpp"
#include "runtime/metrics_tiers.hpp"
#include "runtime/runtime_opener.hpp"
#include "runtime/timeouts.hpp"
#include "scheduler/asio_event_loop.hpp"
#include "scheduler/engine_transfer_port.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/scheduler.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

constexpr double kGiga = 1e9;
// What the links are assumed to do before the first transfers are measured: PCIe Gen5 x16 for
// HBM<->host, one datacenter NVMe drive for the store.
constexpr double kPriorHostLinkBytesPerS = 25 * kGiga;
constexpr double kPriorNvmeReadBytesPerS = 3 * kGiga;
constexpr double kPriorNvmeWriteBytesPerS = 2 * kGiga;
// Cap on bytes in flight per link: deep enough to keep DMA engines and NVMe queues busy, shallow
// enough that a demand load is never behind more than a few milliseconds of background work.
constexpr uint64_t kMaxInflightBytes = 64ull << 20;

LinkModel gbps_model(double gbps, Nanos latency) {
  return LinkModel{gbps > 0 ? gbps * kGiga : 0.0, latency};
}

// The options as the runtime uses them: every timeout > 0 (or an error naming it) and clamped to
// kMaxTimeout, so no conversion to nanoseconds or deadline built from one can overflow.
Result<RuntimeOptions> checked_options(RuntimeOptions options) {
  std::chrono::milliseconds* const timeouts[] = {&options.call_timeout, &options.wait_timeout,
                                                 &options.shutdown_timeout};
  const char* const names[] = {"options.call_timeout", "options.wait_timeout",
                               "options.shutdown_timeout"};
  for (std::size_t i = 0; i < std::size(timeouts); ++i) {
    KVTIER_RETURN_IF_ERROR(check_timeout_ms(timeouts[i]->count(), names[i]));
    *timeouts[i] = clamp_timeout(*timeouts[i]);
  }
  return options;
}

}  // namespace

struct Runtime::Impl {
  Config config;
  RuntimeOptions options;
  std::unique_ptr<TierStack> tiers;
  std::unique_ptr<ExtentAllocator> nvme_capacity;
  std::unique_ptr<PageTable> table;
  std::unique_ptr<AsioEventLoop> loop;
  std::unique_ptr<EngineTransferPort> port;
  std::unique_ptr<Scheduler> scheduler;
  // Declared after what it reads, so it is destroyed (and stops serving) first.
  std::unique_ptr<MetricsExporter> metrics;
  uint16_t namespace_tag = 0;
  BlockKey root;
  uint64_t recovered = 0;
  std::atomic<bool> shut_down{false};
  std::mutex shutdown_mu;
  // Every call that touches the parts below holds this shared; shutdown takes it exclusively
  // before it frees them, so no call ever runs against a freed part.
  mutable std::shared_mutex life_mu;
  RuntimeStats final_stats;  // the counters as shutdown left them

  Nanos call_timeout() const { return timeout_nanos(options.call_timeout); }
  // Recovering the NVMe index may take many loop turns' worth: ten call timeouts, within the cap.
  Nanos recovery_timeout() const {
    return timeout_nanos(std::min(options.call_timeout, kMaxTimeout / 10) * 10);
  }

  Status alive() const {
    if (shut_down.load(std::memory_order_acquire)) {
      return failed_precondition("the runtime was shut down");
    }
    return ok_status();
  }

  // Holds the runtime open for the duration of one call (see life_mu).
  struct Call {
    std::shared_lock<std::shared_mutex> lock;
    Status status;
  };
  Call enter() const {
    Call c{std::shared_lock<std::shared_mutex>(life_mu), alive()};
    return c;
  }

  // Runs `fn` on the loop, while the runtime is held open.
  template <typename Fn>
  Status on_loop(Fn&& fn) {
    Call call = enter();
    KVTIER_RETURN_IF_ERROR(call.status);
    return loop->run_sync(std::forward<Fn>(fn), call_timeout());
  }

  Status check_keys(std::span<const BlockKey> keys, std::string_view call) const {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].namespace_tag() != namespace_tag) {
        return invalid_argument(std::string(call) + ": key " + std::to_string(i) + " (" +
                                to_string(keys[i]) + ") belongs to another namespace (tag " +
                                std::to_string(keys[i].namespace_tag()) + "; this runtime's is " +
                                std::to_string(namespace_tag) + ", namespace \"" + key_namespace() +
                                "\")");
      }
    }
    return ok_status();
  }

  // The counters now (loop thread: no; any thread, the runtime held open).
  RuntimeStats snapshot() const;

  std::string key_namespace() const {
    return config.model.key_namespace.empty() ? config.model.name : config.model.key_namespace;
  }
};

Result<std::unique_ptr<Runtime>> Runtime::open(const Config& config, RuntimeOptions options) {
  return detail::RuntimeOpener::open(config, options, TierStackOptions{});
}

Result<std::unique_ptr<Runtime>> detail::RuntimeOpener::open(const Config& config,
                                                             RuntimeOptions options,
                                                             TierStackOptions tier_options) {
  KVTIER_RETURN_IF_ERROR(validate_config(config));
  auto impl = std::make_unique<Runtime::Impl>();
  impl->config = config;
  KVTIER_ASSIGN_OR_RETURN(impl->options, checked_options(options));
  const Geometry& g = config.model.geometry;
  impl->namespace_tag = kvtier::namespace_tag(impl->key_namespace());
  impl->root = kvtier::namespace_root(impl->key_namespace());

  auto tiers = open_tiers(config.tiers, g, std::move(tier_options));
  if (!tiers.ok()) return std::move(tiers).status().with_context("opening the tiers");
  impl->tiers = std::move(tiers).value();
  TierStack& t = *impl->tiers;
  if (t.nvme != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(
        impl->nvme_capacity,
        ExtentAllocator::create({static_cast<uint32_t>(t.nvme->capacity_blocks())}, 1, 0));
  }
  PageTableOptions pto;
  pto.layers = g.layers;
  pto.expected_blocks = t.host->frame_count() / std::max<uint32_t>(1, g.layers) +
                        (t.nvme != nullptr ? t.nvme->capacity_blocks() : 0);
  KVTIER_ASSIGN_OR_RETURN(
      impl->table, PageTable::create(pto, TierAllocators{&t.hbm->allocator(), &t.host->allocator(),
                                                         impl->nvme_capacity.get()}));
  KVTIER_ASSIGN_OR_RETURN(impl->loop, AsioEventLoop::create());

  std::array<LinkModel, kNumLinks> configured{};
  std::array<LinkModel, kNumLinks> prior{};
  const Nanos us = kNanosPerMicro;
  configured[static_cast<int>(Link::kHostToHbm)] = gbps_model(config.tiers.hbm.link_gbps, 10 * us);
  configured[static_cast<int>(Link::kHbmToHost)] = gbps_model(config.tiers.hbm.link_gbps, 10 * us);
  configured[static_cast<int>(Link::kNvmeToHost)] =
      gbps_model(config.tiers.nvme.read_gbps, 80 * us);
  configured[static_cast<int>(Link::kHostToNvme)] =
      gbps_model(config.tiers.nvme.write_gbps, 80 * us);
  prior[static_cast<int>(Link::kHostToHbm)] = LinkModel{kPriorHostLinkBytesPerS, 10 * us};
  prior[static_cast<int>(Link::kHbmToHost)] = LinkModel{kPriorHostLinkBytesPerS, 10 * us};
  prior[static_cast<int>(Link::kNvmeToHost)] = LinkModel{kPriorNvmeReadBytesPerS, 80 * us};
  prior[static_cast<int>(Link::kHostToNvme)] = LinkModel{kPriorNvmeWriteBytesPerS, 80 * us};
  impl->port = std::make_unique<EngineTransferPort>(
      *t.engine, t.nvme_io(), *impl->loop, config.tiers.host_page_format(g),
      config.tiers.nvme_page_format(g), configured, prior);

  SchedulerOptions so;
  so.geometry = g;
  so.policies = config.policies;
  so.watermarks = {config.tiers.hbm.watermarks, config.tiers.host.watermarks,
                   config.tiers.nvme.watermarks};
  so.max_inflight_bytes.fill(kMaxInflightBytes);
  so.wait_timeout = timeout_nanos(impl->options.wait_timeout);
  so.nvme_write_pause = nvme_write_pause_options(config.tiers.nvme);
  so.nvme_read_pause = nvme_read_pause_options(config.tiers.nvme);
  SchedulerParts parts{impl->table.get(),   impl->port.get(),     impl->loop.get(),
                       &t.hbm->allocator(), &t.host->allocator(), impl->nvme_capacity.get()};
  KVTIER_ASSIGN_OR_RETURN(impl->scheduler, Scheduler::create(parts, so));

  // The NVMe store's recovered index: blocks cached before the last shutdown are hits again.
  if (t.nvme != nullptr) {
    const std::vector<BlockKey> keys = t.nvme->keys();
    Scheduler* s = impl->scheduler.get();
    uint64_t adopted = 0;
    Status st = impl->loop->run_sync(
        [&] {
          for (const BlockKey& k : keys) {
            if (s->adopt_nvme_block(k).ok()) ++adopted;
          }
          return ok_status();
        },
        impl->recovery_timeout());
    KVTIER_RETURN_IF_ERROR(st.with_context("recovering the nvme index"));
    impl->recovered = adopted;
    if (adopted > 0) {
      log(LogLevel::kInfo, "recovered " + std::to_string(adopted) + " blocks from the nvme store");
    }
  }
  KVTIER_ASSIGN_OR_RETURN(
      impl->metrics,
      MetricsExporter::create(config.metrics,
                              runtime_metrics_sources(&impl->scheduler->stats(), *impl->tiers)));
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

Result<std::unique_ptr<Runtime>> Runtime::open_file(std::string_view yaml_path,
                                                    RuntimeOptions options) {
  ConfigSources sources;
  sources.file = std::string(yaml_path);
  KVTIER_ASSIGN_OR_RETURN(Config config, load_config(sources));
  return open(config, options);
}

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  Status s = shutdown();
  if (!s.ok()) log(LogLevel::kWarn, "runtime shutdown: " + s.to_string());
}

const Config& Runtime::config() const { return impl_->config; }
const Geometry& Runtime::geometry() const { return impl_->config.model.geometry; }

std::vector<BlockKey> Runtime::block_keys(std::span<const uint32_t> tokens) const {
  return chain_block_keys(impl_->key_namespace(), tokens, geometry().page_tokens);
}

Result<BlockKey> Runtime::block_key(const BlockKey& parent,
                                    std::span<const uint32_t> block_tokens) const {
  if (block_tokens.size() != geometry().page_tokens) {
    return invalid_argument("block_key: a block holds " + std::to_string(geometry().page_tokens) +
                            " tokens, got " + std::to_string(block_tokens.size()));
  }
  KVTIER_RETURN_IF_ERROR(impl_->check_keys(std::span(&parent, 1), "block_key"));
  return chain_block_key(parent, block_tokens);
}

BlockKey Runtime::namespace_root() const { return impl_->root; }

Result<MatchResult> Runtime::match(std::span<const BlockKey> keys) {
  Impl::Call call = impl_->enter();
  KVTIER_RETURN_IF_ERROR(call.status);
  KVTIER_RETURN_IF_ERROR(impl_->check_keys(keys, "match"));
  return impl_->scheduler->match(keys);
}

Result<OpenedSequence> Runtime::open_sequence(std::span<const BlockKey> prompt_keys) {
  KVTIER_RETURN_IF_ERROR(impl_->check_keys(prompt_keys, "open_sequence"));
  OpenedSequence out;
  KVTIER_RETURN_IF_ERROR(impl_->on_loop([&] {
    KVTIER_ASSIGN_OR_RETURN(out, impl_->scheduler->open_sequence(prompt_keys));
    return ok_status();
  }));
  return out;
}

Status Runtime::close_sequence(SequenceId sequence, std::optional<uint64_t> generated_tokens) {
  return impl_->on_loop(
      [&] { return impl_->scheduler->close_sequence(sequence, generated_tokens); });
}

Result<StepInfo> Runtime::begin_step(std::span<const StepItem> batch) {
  StepInfo out;
  KVTIER_RETURN_IF_ERROR(impl_->on_loop([&] {
    KVTIER_ASSIGN_OR_RETURN(out, impl_->scheduler->begin_step(batch));
    return ok_status();
  }));
  return out;
}

Status Runtime::wait_layer(StepId step, uint32_t layer) {
  Impl::Call call = impl_->enter();
  KVTIER_RETURN_IF_ERROR(call.status);
  Status waited = impl_->scheduler->wait_layer(step, layer);
  if (waited.code() != StatusCode::kDeadlineExceeded) return waited;
  // Past the wait timeout: say what the scheduler is still waiting on and who holds the frames,
  // which is where an operator starts (the call is already held open: run on the loop directly).
  std::string pending;
  Status asked = impl_->loop->run_on_loop_thread(
      [&] {
        pending = impl_->scheduler->pending_summary();
        return ok_status();
      },
      impl_->call_timeout());
  if (!asked.ok()) return waited;
  return Status(waited.code(), "wait_layer: step " + std::to_string(step) + " layer " +
                                   std::to_string(layer) + ": " + waited.message() +
                                   "; the scheduler is waiting on: " + pending);
}

Result<LayerTable> Runtime::layer_table(StepId step, uint32_t layer) const {
  Impl::Call call = impl_->enter();
  KVTIER_RETURN_IF_ERROR(call.status);
  return impl_->scheduler->layer_table(step, layer);
}

Status Runtime::end_layer(StepId step, uint32_t layer) {
  return impl_->on_loop([&] { return impl_->scheduler->end_layer(step, layer); });
}

Status Runtime::end_step(StepId step, std::span<const StepCompletion> completions) {
  for (const StepCompletion& c : completions) {
    KVTIER_RETURN_IF_ERROR(impl_->check_keys(c.full_block_keys, "end_step"));
  }
  return impl_->on_loop([&] { return impl_->scheduler->end_step(step, completions); });
}

Status Runtime::abort_step(StepId step) {
  return impl_->on_loop([&] { return impl_->scheduler->abort_step(step); });
}

Status Runtime::hint(std::span<const HintedRequest> waiting) {
  for (const HintedRequest& r : waiting) KVTIER_RETURN_IF_ERROR(impl_->check_keys(r.keys, "hint"));
  return impl_->on_loop([&] { return impl_->scheduler->hint(waiting); });
}

Result<PrefixPinId> Runtime::pin_prefix(std::span<const BlockKey> keys,
                                        std::chrono::milliseconds ttl) {
  KVTIER_RETURN_IF_ERROR(check_timeout_ms(ttl.count(), "pin_prefix: ttl"));
  KVTIER_RETURN_IF_ERROR(impl_->check_keys(keys, "pin_prefix"));
  PrefixPinId id = 0;
  KVTIER_RETURN_IF_ERROR(impl_->on_loop([&] {
    KVTIER_ASSIGN_OR_RETURN(id, impl_->scheduler->pin_prefix(keys, timeout_nanos(ttl)));
    return ok_status();
  }));
  return id;
}

Status Runtime::unpin_prefix(PrefixPinId pin) {
  return impl_->on_loop([&] { return impl_->scheduler->unpin_prefix(pin); });
}

HbmView Runtime::hbm_view() const {
  Impl::Call call = impl_->enter();
  if (!call.status.ok()) return HbmView{};  // shut down: there is no arena any more
  const HbmArena& hbm = *impl_->tiers->hbm;
  HbmView v;
  v.base = hbm.base();
  v.frame_stride = hbm.frame_bytes();
  v.page_bytes = hbm.page_bytes();
  v.frames = hbm.frame_count();
  v.on_device = hbm.device_memory();
  return v;
}

RuntimeStats Runtime::stats() const {
  Impl::Call call = impl_->enter();
  if (!call.status.ok()) return impl_->final_stats;
  return impl_->snapshot();
}

RuntimeStats Runtime::Impl::snapshot() const {
  RuntimeStats r;
  const SchedulerStats& s = scheduler->stats();
  const auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  r.lookup_tokens = get(s.lookup_tokens);
  for (Tier t : kAllTiers) {
    const int i = tier_index(t);
    r.hit_tokens[i] = get(s.hit_tokens[i]);
    r.promotions[i] = get(s.promotions[i]);
    r.demotions[i] = get(s.demotions[i]);
    r.evictions[i] = get(s.evictions[i]);
    r.hinted_loads[i] = get(s.hinted_loads[i]);
    r.hinted_loads_reused[i] = get(s.hinted_loads_reused[i]);
  }
  const TierStack& t = *tiers;
  r.used_bytes[tier_index(Tier::kHbm)] = t.hbm->used_bytes();
  r.capacity_bytes[tier_index(Tier::kHbm)] = t.hbm->capacity_bytes();
  r.used_bytes[tier_index(Tier::kHost)] = t.host->used_bytes();
  r.capacity_bytes[tier_index(Tier::kHost)] = t.host->capacity_bytes();
  if (t.nvme != nullptr) {
    const uint64_t extent =
        t.nvme->capacity_blocks() == 0 ? 0 : t.nvme->page_format().block_bytes();
    r.used_bytes[tier_index(Tier::kNvme)] = t.nvme->used_blocks() * extent;
    r.capacity_bytes[tier_index(Tier::kNvme)] = t.nvme->capacity_blocks() * extent;
  }
  r.recompute_tokens = get(s.recompute_tokens);
  r.stall_nanos = get(s.stall_nanos);
  r.late_prefetches = get(s.late_prefetches);
  r.failed_loads = get(s.failed_loads);
  r.checksum_failures = get(t.stats->checksum_failures);
  r.io_errors = get(t.stats->io_errors);
  r.nvme_recovered_blocks = recovered;
  r.open_sequences = get(s.open_sequences);
  r.pinned_prefix_blocks = get(s.pinned_prefix_blocks);
  return r;
}

Status Runtime::audit() {
  Impl::Call call = impl_->enter();
  KVTIER_RETURN_IF_ERROR(call.status);
  return impl_->loop->run_on_loop_thread([&] { return impl_->scheduler->audit(); },
                                         impl_->call_timeout());
}

uint16_t Runtime::metrics_port() const {
  Impl::Call call = impl_->enter();
  if (!call.status.ok()) return 0;
  const MetricsExporter* m = impl_->metrics.get();
  return m != nullptr && m->serving() ? m->port() : 0;
}

Status Runtime::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mu);
  if (impl_->shut_down.exchange(true)) return ok_status();
  Impl& im = *impl_;
  // New calls fail from here on. Open steps are aborted so engine threads blocked in wait_layer
  // return now; then wait for every call in flight to leave before anything is freed.
  im.loop
      ->run_on_loop_thread(
          [&] {
            im.scheduler->abort_all_steps();
            return ok_status();
          },
          im.call_timeout())
      .ignore();
  std::unique_lock<std::shared_mutex> exclusive(im.life_mu);
  im.metrics.reset();  // stop serving before what it reads goes away
  const auto deadline = std::chrono::steady_clock::now() + im.options.shutdown_timeout;
  if (im.options.persist_on_shutdown) {
    uint64_t started = 0;
    im.loop
        ->run_on_loop_thread(
            [&] {
              started = im.scheduler->persist_to_nvme();
              return ok_status();
            },
            im.call_timeout())
        .ignore();
    if (started > 0) {
      log(LogLevel::kInfo, "persisting " + std::to_string(started) + " blocks to nvme");
    }
  }
  // Let every queued and in-flight transfer finish (they complete on the loop). Copies that wait
  // for frames while no transfer moves wait for good (open sequences hold the frames and no engine
  // call will release them now): a few such checks in a row end the wait early.
  constexpr int kQuietChecks = 5;
  bool idle = false;
  std::string stuck;  // what waited for good, once that is established
  for (int quiet_checks = 0; std::chrono::steady_clock::now() < deadline;) {
    im.loop
        ->run_on_loop_thread(
            [&] {
              idle = im.scheduler->idle();
              quiet_checks = !idle && im.scheduler->transfers_idle() ? quiet_checks + 1 : 0;
              if (quiet_checks == kQuietChecks) stuck = im.scheduler->pending_summary();
              return ok_status();
            },
            im.call_timeout())
        .ignore();
    if (idle || !stuck.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // No watermark plan starts copies from here on: the copy engines are about to stop.
  im.loop
      ->run_on_loop_thread(
          [&] {
            im.scheduler->stop_watermark_checks();
            return ok_status();
          },
          im.call_timeout())
      .ignore();
  // Stop the producers of completions first: the engine's destructor waits for its queued copies
  // and the store's for its I/O threads; their completions post to the loop, which still runs
  // them against a live scheduler. Then drain the loop, and take the rest down in reverse order.
  im.final_stats = im.snapshot();
  im.tiers->engine.reset();
  im.tiers->nvme.reset();
  im.loop->run_on_loop_thread([] { return ok_status(); }, im.call_timeout()).ignore();
  im.scheduler.reset();
  im.port.reset();
  im.loop.reset();
  im.table.reset();
  im.tiers.reset();
  if (idle) return ok_status();
  if (!stuck.empty()) {
    return cancelled(
        "shutdown: copies waiting for frames that nothing in flight frees were "
        "cancelled (" +
        stuck + ")");
  }
  return deadline_exceeded("shutdown: transfers were still in flight after " +
                           std::to_string(im.options.shutdown_timeout.count()) +
                           " ms; they were cancelled");
}

}  // namespace kvtier
