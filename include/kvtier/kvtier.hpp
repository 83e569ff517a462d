// kvtier's C++ API: the Runtime an LLM serving engine embeds as its KV-cache backend.
//
// A Runtime owns the three tiers (an HBM arena, a pinned host pool, an NVMe store), the page table
// that maps block keys to pages in them, and the scheduler that moves pages between tiers on its
// own event-loop thread. The engine drives it with the step contract (DESIGN.md, "How an engine
// uses it"):
//
//   auto rt = kvtier::Runtime::open(config).value();
//   auto keys = rt->block_keys(prompt_tokens);            // chained content keys of full blocks
//   auto seq = rt->open_sequence(keys).value();           // reuse the cached prefix
//   // prefill from seq.reused_tokens, then decode:
//   auto step = rt->begin_step({{seq.id, n_new}}).value();
//   for (layer...) { rt->wait_layer(step.id, layer); auto t = rt->layer_table(step.id, layer);
//                    ... write new K/V into t's frames, run attention over them ...;
//                    rt->end_layer(step.id, layer); }
//   rt->end_step(step.id, {});
//   rt->close_sequence(seq.id);
//
// Thread-safety. Every method may be called from any thread. Calls that change the cache (open,
// close, begin/end step and layer, hint, pins) run on the runtime's loop, one at a time and in
// order: when the loop is idle the call runs on the caller's own thread; otherwise the caller
// waits for the loop to take the call for at most `RuntimeOptions::call_timeout`
// (kDeadlineExceeded otherwise, and the call then has no effect), and the loop never blocks, so
// those calls return in microseconds. wait_layer blocks only the calling thread, at most the
// configured wait bound (policies.prefetch: a late layer is a stall, counted; after the bound,
// kDeadlineExceeded). layer_table, hbm_view, stats, match and the key helpers never wait on the
// loop.
//
// Errors are Status values naming what was wrong (see kvtier/status.hpp); no call throws, and bad
// input — an unknown or closed sequence, a step over a sequence twice, keys of another namespace, a
// step that cannot fit, any call after shutdown — is an error code and a message, never a crash.
// After an error nothing leaks: the runtime's accounting stays exact.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "kvtier/step_types.hpp"
#include "kvtier/types.hpp"
#include "kvtier/version.hpp"

namespace kvtier {

// Every timeout must be > 0 (Runtime::open refuses others, naming the option); one longer than 100
// years, milliseconds::max() included, is taken as 100 years. The same holds for pin_prefix's ttl.
struct RuntimeOptions {
  // Longest a caller waits for the runtime's loop to take a call (not for transfers).
  std::chrono::milliseconds call_timeout{5000};
  // Longest wait_layer blocks before it gives up with kDeadlineExceeded.
  std::chrono::milliseconds wait_timeout{30000};
  // At shutdown, write every cached block that is not on NVMe yet there, so the next runtime
  // opened on the same store finds it (bounded by shutdown_timeout).
  bool persist_on_shutdown = true;
  std::chrono::milliseconds shutdown_timeout{60000};
};

// Where the HBM frames are, for the engine's own kernels: frame f of the arena starts at
// base + f * frame_stride and holds one page (K then V, each [page_tokens][kv_heads][head_dim]).
struct HbmView {
  void* base = nullptr;
  std::size_t frame_stride = 0;
  std::size_t page_bytes = 0;
  uint32_t frames = 0;
  bool on_device = false;  // true: CUDA device memory; false: host memory (emulated HBM)
};

// A snapshot of the runtime's counters (each exact on its own; not one atomic cut).
struct RuntimeStats {
  uint64_t lookup_tokens = 0;
  std::array<uint64_t, kNumTiers> hit_tokens{};
  std::array<uint64_t, kNumTiers> used_bytes{};
  std::array<uint64_t, kNumTiers> capacity_bytes{};
  std::array<uint64_t, kNumTiers> promotions{};
  std::array<uint64_t, kNumTiers> demotions{};
  std::array<uint64_t, kNumTiers> evictions{};
  uint64_t recompute_tokens = 0;  // compute-or-load chose to recompute
  uint64_t stall_nanos = 0;
  uint64_t late_prefetches = 0;
  // Blocks a waiting request's hint brought into a tier (hbm, host) before any sequence asked for
  // them, and of those the blocks a request reused (SchedulerStats::hinted_loads).
  std::array<uint64_t, kNumTiers> hinted_loads{};
  std::array<uint64_t, kNumTiers> hinted_loads_reused{};
  uint64_t failed_loads = 0;
  uint64_t checksum_failures = 0;
  uint64_t io_errors = 0;
  uint64_t nvme_recovered_blocks = 0;  // found on NVMe when this runtime opened
  uint64_t open_sequences = 0;
  uint64_t pinned_prefix_blocks = 0;
};

using PrefixPinId = uint64_t;

namespace detail {
struct RuntimeOpener;  // opens a Runtime over replaced tier seams (tests); not part of the API
}  // namespace detail

class Runtime {
 public:
  // Opens the tiers, recovers the NVMe store's index and starts the loop. The config is validated
  // first (the same rules as YAML). Metrics are exported when config.metrics.listen is set.
  static Result<std::unique_ptr<Runtime>> open(const Config& config, RuntimeOptions options = {});
  // From a YAML file (plus KVTIER_* environment overrides; see the README).
  static Result<std::unique_ptr<Runtime>> open_file(std::string_view yaml_path,
                                                    RuntimeOptions options = {});
  // Shuts down if shutdown() was not called.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Config& config() const;
  const Geometry& geometry() const;

  // ---- Block keys (namespace = config.model.namespace, or the model name) ----
  // Keys of every full block of `tokens`, chained from the namespace root.
  std::vector<BlockKey> block_keys(std::span<const uint32_t> tokens) const;
  // The key of one full block after `parent` (a key from block_keys, or namespace_root()).
  Result<BlockKey> block_key(const BlockKey& parent, std::span<const uint32_t> block_tokens) const;
  BlockKey namespace_root() const;

  // ---- Cache ----
  // The cached prefix of `keys`, per tier. A peek: counts no lookup or hit and takes no
  // reference (open_sequence counts the request once).
  Result<MatchResult> match(std::span<const BlockKey> keys);
  // Opens a sequence over a prompt's keys: takes references on the prefix it reuses (as much of the
  // match as is cheaper to load than to recompute) and starts loading it.
  Result<OpenedSequence> open_sequence(std::span<const BlockKey> prompt_keys);
  // Releases the sequence; its full blocks stay cached until evicted. `generated_tokens`, when the
  // engine gives it, is how many tokens the request generated after its prompt: the lookahead
  // policy learns from it which prompts come back (on the public Mooncake trace a prompt answered
  // in a few tokens comes back far more often than one answered at length).
  Status close_sequence(SequenceId sequence,
                        std::optional<uint64_t> generated_tokens = std::nullopt);

  // ---- Steps ----
  Result<StepInfo> begin_step(std::span<const StepItem> batch);
  // kOk once the layer is ready; a load's error; kUnavailable when a failed NVMe transfer, or
  // writes to NVMe paused after failing, left the step without the room it was admitted with, or
  // a read it needs from NVMe finds host memory full of pages only the engine can free, or a
  // block it reuses left NVMe before its read started (another read of it failed, or its drive
  // was taken out of service): abort and begin it again (it then recomputes what it lost);
  // kDeadlineExceeded after wait_timeout, or sooner when a read it needs from NVMe went
  // unanswered past tiers.nvme.io_timeout_ms (a hung drive: abort and begin it again, it then
  // recomputes the block); kCancelled when the step is aborted or the runtime shuts down.
  Status wait_layer(StepId step, uint32_t layer);
  // The layer's block table; kFailedPrecondition until the layer is ready (wait_layer first).
  Result<LayerTable> layer_table(StepId step, uint32_t layer) const;
  // The engine has read and written `layer` (required for every layer of a windowed step).
  Status end_layer(StepId step, uint32_t layer);
  Status end_step(StepId step, std::span<const StepCompletion> completions = {});
  Status abort_step(StepId step);
  // The requests waiting in the engine's queue, in the order they will start (replaces the
  // previous hint). Hint the whole queue whenever it changes: a request hinted again with the
  // same keys only has its expected start moved. The cached prefixes of the first
  // policies.prefetch.depth requests are read ahead, below the loads of open sequences.
  Status hint(std::span<const HintedRequest> waiting);

  // ---- Pins for prefixes the engine wants kept (a system prompt, a document corpus) ----
  // Keeps the cached blocks of `keys` in HBM (loading them there) until unpin_prefix or `ttl`
  // passes, within the HBM pin quota (policies.pin_quota). kResourceExhausted over the quota, or
  // when open steps hold the HBM frames the pins would need; kNotFound when a key is not cached.
  Result<PrefixPinId> pin_prefix(std::span<const BlockKey> keys, std::chrono::milliseconds ttl);
  Status unpin_prefix(PrefixPinId pin);

  // ---- Memory and counters ----
  HbmView hbm_view() const;
  // Never waits on the event loop: every counter and gauge is read as it stands (each exact at a
  // quiescent point, not a snapshot across fields). After shutdown, the final values.
  RuntimeStats stats() const;
  // The port the metrics exporter listens on (0 when metrics are off or failed to bind).
  uint16_t metrics_port() const;
  // Checks kvtier's own invariants, on the loop between two of its decisions: every allocated frame
  // and extent belongs to exactly one copy and the page table's counts equal a recount
  // (PageTable::audit), and each tier's eviction policy tracks exactly the blocks with a ready copy
  // there (a block it missed could never leave). kInternal naming the first broken one. It walks
  // the whole table under all its locks: for tests and debugging, not for every step.
  Status audit();

  // Finishes or cancels in-flight transfers, optionally persists cached blocks to NVMe, and stops
  // the loop. Every later call returns kFailedPrecondition. Idempotent. kDeadlineExceeded when
  // transfers were still running after shutdown_timeout; kCancelled, without waiting that long,
  // when copies waited for frames that only engine calls could have freed (the message says what
  // held them).
  Status shutdown();

 private:
  friend struct detail::RuntimeOpener;
  struct Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
