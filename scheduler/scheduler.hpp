// Scheduler: drives every page between tiers so that a step's attention only reads pages resident
// in HBM, and keeps the cache's decisions (what stays, what goes where, what loads first).
//
// The step contract (DESIGN.md, "How an engine uses it"):
//   open_sequence(keys)  reuse the cached prefix of a prompt — as much of it as is cheaper to load
//                        than to recompute (compute-or-load) — and start loading it;
//   begin_step(batch)    for each sequence, the pages it reads this step plus fresh pages for the
//                        tokens it appends; pins them layer by layer and schedules what is missing.
//                        When the whole batch fits in the HBM that other open steps and pinned
//                        prefixes leave, every layer is pinned at once (a block resident in all
//                        of them by one block pin, held until the step ends); otherwise a window
//                        of layers is (layer L computes while the next ones load), and
//                        end_layer(L) releases L and plans the next layer; when not even one
//                        layer fits, it
//                        fails (kResourceExhausted, with the frames needed and available);
//   wait_layer(L)        (engine thread, no loop involved) blocks until layer L's pages have
//   arrived; layer_table(L)       the CSR block table of HBM frames for layer L (valid once L is
//   ready); end_step(keys)       unpins, completes the pages the engine wrote, publishes blocks
//   that became
//                        full under their content keys (deduplicating against the cache) and
//                        applies the write policy;
//   close_sequence       releases the sequence; its full blocks stay cached until evicted. Given
//                        how many tokens the request generated, the policies learn from it
//                        which prompts come back (Evictor::on_request_end).
//
// Threading. Every method except wait_layer/layer_table/stats runs as a task of the EventLoop,
// one task at a time: the runtime marshals engine calls with EventLoop::run_sync (bounded; on an
// idle loop the engine's own thread runs the task, holding the loop's turn), and the simulated
// engine of the benchmark runs on the loop itself. So the scheduler, its placement and its
// evictors need no locks; the page table it drives is concurrent anyway (match may run on engine
// threads). Transfers run on the TransferPort's engines and complete as loop tasks.
//
// Moves. A page is promoted NVMe -> host -> HBM, each step a TransferPort job queued by priority
// (demand > a sequence just opened > prefetch > write-back, LinkQueues) under a per-link cap on
// bytes in flight. Frames are taken with PageTable::begin_fill; when a tier has no free frame the
// request waits in that tier's queue and the Placement plans room (its victims are demoted or
// dropped, asynchronously). Pages being copied out of HBM are pinned (write-through) or draining
// (eviction), so nothing reuses a frame under a transfer. A failed load makes the page a miss: the
// waiting layer fails, the engine recomputes; the bytes are never served. A read from NVMe the
// drive holds past its I/O timeout fails then (the port abandons it), so a hung drive fails a
// step at that timeout, not at wait_timeout; its host frames stay held by the table, out of every
// plan, until the port says the drive answered (FailedRead, FramesReleased). Blocks of open
// sequences (references > 0) and private blocks never lose their last copy: they are demoted
// whatever admission says, or stay. A plan counts in the tiers below only frames a demotion may
// take (room_for_plans); a demotion waiting for a host frame that nothing in flight will free is
// withdrawn (withdraw_host_requests), as is a prefetch's read from NVMe.
//
// Deadlines. Every wait is bounded (prefetch.deadline_ms for stall accounting, wait_timeout as the
// hard bound). A late page stalls the step (counted), or, with prefetch.on_late = recompute, the
// first step of a sequence gives up the part of its reused prefix that is still loading and tells
// the engine to recompute it. A step that a failed NVMe write or read leaves without the HBM room
// it was admitted with fails its unfinished layers at once (kUnavailable), never waiting for
// frames no move can free. Writes that keep failing pause writing to NVMe (NvmeHealth,
// scheduler_nvme_failures.cpp): while paused, nothing is planned toward NVMe, the steps' fit counts
// every block in use as kept in memory, and steps that no longer fit fail the same way. Reads
// that keep failing pause reading from NVMe: while paused, compute-or-load reuses no block found
// only there and hints read none. Extents the store retires after media errors are retired in
// the table's NVMe allocator too, so that plans count only the extents left in service, and come
// back to it when the store readmits a drive.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/config.hpp"
#include "kvtier/scheduler_stats.hpp"
#include "kvtier/status.hpp"
#include "kvtier/step_types.hpp"
#include "scheduler/copy_batcher.hpp"
#include "scheduler/event_loop.hpp"
#include "scheduler/layer_readiness.hpp"
#include "scheduler/link_queues.hpp"
#include "scheduler/nvme_health.hpp"
#include "scheduler/page_table.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/policies/admission.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/write_strategy.hpp"
#include "scheduler/transfer_port.hpp"

namespace kvtier {

struct PageSnapshot;  // scheduler_internal.hpp

struct SchedulerOptions {
  Geometry geometry;
  PoliciesConfig policies;
  std::array<Watermarks, kNumTiers> watermarks{};
  // Cap on bytes in flight per link (indexed by Link); 0 = no cap.
  std::array<uint64_t, kNumLinks> max_inflight_bytes{};
  // Hard bound on any wait of an engine thread (wait_layer), whatever the deadline policy says.
  Nanos wait_timeout = 30 * kNanosPerSecond;
  // When failed NVMe writes pause writing there, and failed reads reading (NvmeHealth).
  NvmePauseOptions nvme_write_pause;
  NvmePauseOptions nvme_read_pause;
};

// What the scheduler drives; nothing is owned, everything must outlive it. `nvme` may be null (no
// NVMe tier): then the page table's NVMe copies are never used.
struct SchedulerParts {
  PageTable* table = nullptr;
  TransferPort* port = nullptr;
  EventLoop* loop = nullptr;
  FrameAllocator* hbm = nullptr;
  FrameAllocator* host = nullptr;
  ExtentAllocator* nvme = nullptr;
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerParts& parts,
                                                   const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- Loop thread ----
  // The cached prefix of a key chain, per tier. A peek: it counts no lookup and records no hit
  // (an engine may ask about a queued request many times); open_sequence counts the request's
  // lookup and its hits, once. Any thread.
  MatchResult match(std::span<const BlockKey> keys) const;
  Result<OpenedSequence> open_sequence(std::span<const BlockKey> prompt_keys);
  // `generated_tokens`: what the request generated after its prompt, when the engine knows it.
  Status close_sequence(SequenceId id, std::optional<uint64_t> generated_tokens = std::nullopt);
  Result<StepInfo> begin_step(std::span<const StepItem> batch);
  // The engine is done reading and writing `layer` of the step (windowed steps: releases it and
  // plans the next layer). Optional when the step is not windowed. kFailedPrecondition, changing
  // nothing, when the layer is not ready (its pages cannot have been written).
  Status end_layer(StepId step, uint32_t layer);
  // Completes the pages the engine wrote and publishes full blocks. A layer that never became
  // ready (failed, or not waited for) means pages left unwritten: the step is aborted instead and
  // kFailedPrecondition says which layer.
  Status end_step(StepId step, std::span<const StepCompletion> completions);
  // Gives a step up (the engine failed it, e.g. a layer that could not load): unpins, discards the
  // pages it was to write and leaves every sequence as it was before the step.
  Status abort_step(StepId step);
  // Aborts every open step (shutdown): engine threads blocked in wait_layer return kCancelled.
  void abort_all_steps();
  // Replaces the set of waiting requests the policies and the prefetcher see.
  Status hint(std::span<const HintedRequest> waiting);
  // A block found on NVMe at start-up (the store's recovered index): cached, on NVMe only.
  Status adopt_nvme_block(const BlockKey& key);
  // Prefix pins: keeps the cached blocks of `keys` referenced and in HBM (loading them there) until
  // unpin_prefix or `ttl`, within policies.pin_quota of HBM and of the frames open steps leave
  // (kResourceExhausted otherwise). Returns the pin's id.
  Result<uint64_t> pin_prefix(std::span<const BlockKey> keys, Nanos ttl);
  Status unpin_prefix(uint64_t id);
  // Loop thread; other threads read stats().pinned_prefix_blocks.
  uint64_t pinned_prefix_blocks() const { return protected_.size(); }
  // Starts writing every cached block that has no NVMe copy to NVMe (before a shutdown, so the
  // next runtime on the same store finds them). Returns how many blocks it started writing: none
  // while writes to NVMe are paused after failing (it says so).
  uint64_t persist_to_nvme();
  // Shutdown, once the transfers drained: no watermark check is planned or carried on from here,
  // so no loop task starts copies after the copy engines stop (a turn already posted does
  // nothing). Loop thread.
  void stop_watermark_checks();
  // True when no transfer is queued or in flight (nor about to be: transfers_idle) and no request
  // waits for a frame.
  bool idle() const;
  // True when no copy is queued on a link or in flight, and no watermark check that may start
  // some waits to run. With no engine call to come (shutdown), nothing pending can move any more:
  // what still waits, waits for frames nothing will free.
  bool transfers_idle() const {
    return links_.idle() && batcher_.idle() && !watermark_turn_posted_;
  }
  // Checks that each tier's evictor tracks exactly the blocks with a ready copy in that tier (a
  // page for HBM and host memory, the extent for NVMe): one it does not track can never be chosen
  // to leave, and its frames are lost to the cache; one it tracks without a ready copy (leaving
  // already) would be counted as room twice. A block whose copies there are still arriving may
  // be untracked until the last lands. Holds between any two of the loop's tasks; it reads the
  // page table's consistent cut (PageTable::snapshot), so it is for tests and diagnostics.
  Status audit_membership() const;
  // A block in use whose NVMe read failed: when that left a page with no copy, the sequences that
  // read it recompute it at their next begin_step. The one way a block in use loses a page.
  bool lost_to_a_failed_read(const BlockKey& key) const { return lost_blocks_.contains(key); }
  // Every invariant a test or an operator can ask for: the page table's audit (frames, counts),
  // then audit_membership. Holds between any two of the loop's tasks; walks the whole table.
  Status audit() const;
  // What keeps the scheduler from being idle, for diagnostics ("3 ops (hbm fill ...), ...").
  std::string pending_summary() const;

  // ---- Any thread ----
  // Blocks until `layer` of `step` is ready (all its pages arrived), at most the step's deadline
  // policy allows; counts stalls. See layer_readiness.hpp for the results. A layer a windowed
  // step has not begun yet may be waited for (another engine thread may end the layers before
  // it meanwhile); if none does, the wait ends at its bound.
  Status wait_layer(StepId step, uint32_t layer);
  // The layer's block table; kFailedPrecondition before the layer is ready.
  Result<LayerTable> layer_table(StepId step, uint32_t layer) const;
  // The readiness of a layer, for engines that cannot block (the simulated engine: on_done).
  Result<std::shared_ptr<LayerReadiness>> layer_readiness(StepId step, uint32_t layer) const;

  const SchedulerStats& stats() const { return stats_; }
  const PlacementCounters& placement_counters() const { return placement_->counters(); }
  const Geometry& geometry() const { return options_.geometry; }
  const LinkQueues& link_queues() const { return links_; }
  // Loop thread; other threads read stats().open_sequences.
  std::size_t open_sequences() const { return sequences_.size(); }

 private:
  struct Sequence;
  struct Step;
  struct PublishedStep;
  struct PageOp;
  struct FrameWaiter;
  struct ResidentPins;
  struct PageKey {
    BlockKey key;
    uint32_t layer = 0;
    Tier tier = Tier::kHbm;
    friend bool operator==(const PageKey&, const PageKey&) = default;
  };
  struct PageKeyHash {
    std::size_t operator()(const PageKey& p) const noexcept {
      return BlockKeyHash()(p.key) ^ (static_cast<std::size_t>(p.layer) * 0x9E3779B1u) ^
             (static_cast<std::size_t>(p.tier) << 60);
    }
  };
  using Done = std::function<void(const Status&)>;
  using FrameGranted = std::function<void(Result<uint32_t>)>;

  Scheduler(const SchedulerParts& parts, const SchedulerOptions& options);
  Status init();

  // ---- Sequences and steps (scheduler.cpp, scheduler_begin_step.cpp, scheduler_step.cpp,
  // scheduler_publish.cpp) ----
  Result<Sequence*> find_sequence(SequenceId id);
  Result<Step*> find_step(StepId id) const;
  // begin_step's phases, in order (see scheduler_begin_step.cpp). The sequences of a batch, each
  // open, once, and in no other step.
  Result<std::vector<Sequence*>> batch_sequences(std::span<const StepItem> batch);
  // Per item: the tokens it has, recomputes and appends, and the pages it reads (Step::items).
  // Late prefixes are given up here (recompute_late_prefix).
  std::vector<StepItemInfo> step_items(std::span<const StepItem> batch,
                                       std::span<Sequence* const> seqs);
  // How many layers at a time the batch fits in HBM (Step::window, windowed, shared_blocks), or
  // resource_exhausted (layer_does_not_fit) when one layer does not.
  Status fit_window(Step& step, std::span<Sequence* const> seqs);
  Status layer_does_not_fit(uint64_t needed_per_layer, uint64_t available) const;
  // Creates or refills the blocks the step's appended tokens need (Step::new_blocks, blocks);
  // undoes them all when one fails.
  Status open_written_blocks(Step& step, std::span<Sequence* const> seqs);
  // Pins what the step finds resident, reads NVMe-only blocks up, and plans the window's layers.
  Status plan_first_layers(Step& s);
  // Pins the blocks of a step that is not windowed which are resident in every layer, all layers
  // at once (one lookup per block: most of a decode step's blocks), for plan_layer to read.
  void pin_resident_blocks(Step& step, ResidentPins& r);
  // What every room plan of HBM does first (make_room, plan_watermark): a plan must see the pins
  // begin_step took page by page, never those it took ahead. So the block pins pins_ahead_ holds
  // become pins of the pages before the one plan_layer is at, which go to the step's per-layer
  // lists, and the pages from there on are unpinned.
  void give_back_pins_ahead();
  // Pins what `layer` reads, loading what is missing (blocks pins_ahead_ holds: their frames).
  Status plan_layer(Step& step, uint32_t layer);
  void release_layer(Step& step, uint32_t layer);
  // Unpins every page the step pinned in `layer` (release_layer, abort_step).
  void unpin_layer(Step& step, uint32_t layer);
  // Releases the block pins of the blocks a step that is not windowed holds whole (end_step,
  // abort_step).
  void release_resident_pins(Step& step);
  // HBM frames a new batch cannot have (see the definition).
  uint64_t frames_held(StepId except = 0) const;
  // kvtier::kept_in_memory of a block a sequence holds.
  bool held_block_kept_in_memory(const BlockKey& key) const {
    return kept_in_memory(key, /*referenced=*/true, /*nvme_tier=*/nvme_writable());
  }
  // A batch's blocks kept in memory: those its sequences hold (each once, pinned prefixes aside:
  // frames_held counts them), and those its step will open. `trades`: pages of those it holds may
  // wait in host memory, and come up only by trading places with pages in HBM.
  struct KeptBlocks {
    uint64_t held = 0;
    uint64_t opened = 0;
    uint64_t refilled_on_nvme = 0;  // opened ones whose NVMe copy keeps an extent (refills_on_nvme)
    bool trades = false;
  };
  // HBM frames that hold pages of blocks kept in memory that host memory cannot take, for a batch
  // computing `window` layers at a time beside `frames_held` (see the definition).
  uint64_t frames_kept_in_memory(const KeptBlocks& batch, uint64_t window,
                                 uint64_t frames_held) const;
  // Blocks whose pages must live in HBM or host memory: without NVMe every block in use; with it
  // the private ones, those in use that NVMe refused (a write that failed), and the other blocks
  // in use with a content key that NVMe has no extent for (an NVMe tier smaller than what open
  // sequences hold).
  // `extents_taken`: NVMe extents blocks in use outside it cannot have (a batch's refills).
  uint64_t blocks_kept_in_memory(uint64_t extents_taken = 0) const;
  // How many of the blocks the item's step opens (from `known` on) are refills of entries NVMe
  // holds (see the definition).
  uint64_t refills_on_nvme(const Sequence& seq, const StepItemInfo& item, std::size_t known) const;
  // HBM frames a batch may have beside `frames_held` when it computes `window` layers at a time
  // (none when taken is more than the capacity).
  uint64_t frames_available(const KeptBlocks& batch, uint64_t window, uint64_t frames_held) const;
  // After blocks in use came to stay in memory (NVMe could not store one, or lost a page of one,
  // or writes there were paused; `what_changed` says which, for the message): the open steps
  // that no longer fit as fit_window admitted them fail their unfinished layers with
  // kUnavailable, so the engine aborts them at once rather than waiting out the timeout for
  // frames no move can free. Begun again, they fit or are refused at once.
  void fail_steps_that_no_longer_fit(const std::string& what_changed);
  // fail_steps_that_no_longer_fit's cause for one block `key` that must stay in memory (`why`).
  static std::string kept_in_memory_because(const BlockKey& key, const Status& why);
  // How many of `keys` (with repeats) are blocks of pinned prefixes.
  uint64_t protected_count(std::span<const BlockKey> keys) const;
  // Stores the sizes of sequences_ and protected_ into the stats' gauges.
  void store_gauges();
  // Gives up a load's HBM fill of (key, layer); when the page is pinned and cannot be aborted
  // yet, remembers it in failed_fills_.
  void give_up_fill(const BlockKey& key, uint32_t layer);
  // Aborts the failed fills of `step`'s pages of `layer` that no pin holds any more.
  void abort_failed_fills(const Step& step, uint32_t layer);
  void finish_written_pages(Step& step, uint32_t layer);
  Result<std::shared_ptr<PublishedStep>> published(StepId id) const;
  // Gives up the reused blocks predicted to arrive after the deadline (Sequence::owed_recompute).
  void recompute_late_prefix(Sequence& seq);
  // A sequence that reads a block whose NVMe read failed with no other copy (lost_blocks_) gives
  // it up, and the blocks after it, for the engine to recompute (recomputed_tokens).
  void recompute_lost_blocks(Sequence& seq);
  // Blocks [b, end) of `seq` go back (released; a private one's pages dropped) and their tokens
  // are owed to a recompute.
  void give_up_blocks_from(Sequence& seq, uint32_t b);
  // A sequence lets go of one of its blocks: released, a private one's pages dropped.
  Status release_sequence_block(const BlockKey& key);
  // A block in use whose NVMe read failed: kept in lost_blocks_, where a sequence that reads it
  // checks at its next begin_step whether a page has no copy left (lacks_a_page).
  void note_if_lost(const BlockKey& key);
  // Some page of `key` has no copy in HBM or host memory, ready or on its way, nor on NVMe.
  bool lacks_a_page(const BlockKey& key) const;
  // match(), counting the lookup and recording hits on the matched blocks (open_sequence).
  MatchResult match_and_count(std::span<const BlockKey> keys);
  bool refillable(const BlockKey& key) const;
  // Drops the host copy of a page of a refilled block that the engine is about to write into HBM,
  // when it is the page's last copy outside HBM (see its comment).
  void drop_host_copy_rewritten(const BlockKey& key, uint32_t layer);
  void plan_written_page(StepId id, const BlockKey& key, uint32_t layer, bool refill,
                         std::function<void(uint32_t)> on_filling,
                         std::shared_ptr<LayerReadiness> ready, int attempt);
  bool loaded_meanwhile(const BlockKey& key, uint32_t layer) const;
  // True when a load holds the HBM frame of (key, layer) (it fills the page, and completes it);
  // a load still before its frame does not: the page a step's engine writes is that step's.
  bool load_fills(const BlockKey& key, uint32_t layer) const;
  void end_engine_write(const BlockKey& key, uint32_t layer);
  Status publish_full_blocks(Sequence& seq, uint64_t old_tokens, const StepCompletion* completion);
  Status publish_block(Sequence& seq, uint64_t index, const BlockKey& content);
  void publish_orphan(const BlockKey& private_key, const BlockKey& content);
  // The one way a full private block gets its content key (publish_block, publish_orphan);
  // returns the key the holder's reference is on afterwards. See the definition.
  Result<BlockKey> publish_as(const BlockKey& private_key, const BlockKey& content, bool orphan);
  void apply_write_policy(const BlockKey& content);
  // True while a transfer or a read names the block (by the key it has now).
  bool block_busy(const BlockKey& key) const;
  // Publishes the deferred blocks whose transfers have ended and whose sequence is between steps.
  void publish_pending();
  void decide_reuse(std::span<const BlockKey> keys, const MatchResult& match, Sequence& seq,
                    OpenedSequence& out);
  Nanos estimated_load_time(Tier from, uint32_t blocks) const;
  // Bytes one block moves over the HBM<->host links (the host tier's page format).
  uint64_t host_block_bytes() const {
    return parts_.port->host_page_bytes() * options_.geometry.layers;
  }
  // Bytes one block moves over the NVMe links (the NVMe tier's page format).
  uint64_t nvme_block_bytes() const {
    return parts_.port->nvme_page_bytes() * options_.geometry.layers;
  }

  // ---- Moves (frames and room, evictor membership: scheduler_moves.cpp; promotions:
  // scheduler_promote.cpp; demotions, write-through, watermarks: scheduler_demote.cpp) ----
  // Brings page (key, layer) into HBM; `done` runs when its HBM copy is ready (or failed).
  // `on_filling` runs as soon as the HBM copy exists (filling), with its frame — the step pins it
  // there.
  void ensure_in_hbm(const BlockKey& key, uint32_t layer, TransferPriority prio,
                     std::function<void(uint32_t frame)> on_filling, Done done);
  void ensure_in_host(const BlockKey& key, uint32_t layer, TransferPriority prio, Done done);
  // A demand joins the HBM load of (key, layer), issued as a prefetch: it becomes a demand in
  // every phase it may be in (see the definition, also for how it is counted).
  void demand_prefetched(const BlockKey& key, uint32_t layer);
  // A demand needs the host copy of (key, layer) that a read from NVMe (of the page or of the
  // whole block), issued as a prefetch, is bringing: the read moves up its link's queue, or, still
  // waiting for host frames, up the frame queue.
  void demand_host_read(const BlockKey& key, uint32_t layer);
  // The host-page read of (key, layer), if one is in flight as a prefetch, moves up its link's
  // queue to `prio` (and becomes a demand for kDemand); true when it did (its frame requests are
  // the caller's to move).
  bool raise_host_op(const BlockKey& key, uint32_t layer, TransferPriority prio);
  // The second half of an HBM load: host copy first, then an HBM frame and the copy up.
  void load_via_host(const BlockKey& key, uint32_t layer, TransferPriority prio);
  // The HBM load of `page` is given up before it took a frame because the page got a copy
  // another way meanwhile (a step's engine writes it: a refill): those who waited for the load
  // ask ensure_in_hbm again, which waits for that write.
  void rejoin_load_waiters(const PageKey& page);
  // With an HBM frame held for (key, layer): copy the host copy up, fetching it again first if it
  // left host memory meanwhile.
  void copy_up(const BlockKey& key, uint32_t layer, TransferPriority prio, uint32_t hbm_frame,
               int refetches);
  // Brings a block toward HBM as a prefetch, for a sequence just opened (its next step reads it)
  // or a request still waiting (hinted), which may fill less of HBM (see the definition).
  // A waiting request's loads are the hint's (PageOp::hinted). Into HBM only with `into_hbm`;
  // returns false when HBM had no room to spare for it (nothing within the same loop task gives
  // any back, so a caller walking a prefix stops asking).
  enum class PrefetchFor { kOpenSequence, kWaitingRequest };
  bool prefetch_block(const BlockKey& key, PrefetchFor whom, bool into_hbm = true);
  bool prefetch_into_hbm(const BlockKey& key, PrefetchFor whom);
  // What a requested frame is for: the reserve it may take (reserve_left_to), and whether the
  // request may be withdrawn (withdraw_host_requests).
  enum class FrameUse : uint8_t {
    kCopy,      // a copy into the tier (a load, a write-through)
    kNvmeRead,  // a host frame an NVMe read fills
    kDemotion,  // a host frame an HBM page being demoted goes to
  };
  // A frame of `tier` for (key, layer), granted at once or once room is made.
  void request_frame(Tier tier, const BlockKey& key, uint32_t layer, TransferPriority prio,
                     FrameGranted granted, FrameUse use = FrameUse::kCopy);
  // A host frame for staging an NVMe write, from the reserve ordinary requests leave free.
  void request_reserved_host_frame(const BlockKey& key, uint32_t layer, FrameGranted granted);
  uint64_t reserve_frames(Tier tier) const;
  // The free frames a request must leave in `tier`: the reserve, except that a demand read from
  // NVMe may take one block's worth of it. What it reads keeps its NVMe copy, so its host copies
  // may be dropped again as soon as they are copied up, and the block staging needs stays free;
  // without it a step whose prefix is on NVMe only waited for good once host memory was full of
  // private pages (which cannot go to NVMe) although HBM had room.
  uint64_t reserve_left_to(Tier tier, TransferPriority prio, FrameUse use) const;
  // Copies the HBM-only pages of a block to host memory (reserve frames), then writes the whole
  // block to NVMe and lets its host pages go: how a block split between HBM and host (a windowed
  // sequence's) leaves host memory when nothing else can.
  void stage_to_nvme(const BlockKey& key, TransferPriority prio);
  // Frees NVMe extents until `extents` are free, by the NVMe room plan (its drops are immediate);
  // false when the blocks there cannot leave (in use, their NVMe copy the last of some page).
  bool make_nvme_room(uint64_t extents, TransferPriority prio);
  void serve_frame_waiters(Tier tier);
  // A demand joined a prefetch of `key` still waiting for frames in `tier`: its requests (only
  // those of `layer`, unless kAllLayers) move to the `to` queue (in their order), and room is made
  // at that priority.
  static constexpr uint32_t kAllLayers = 0xFFFF'FFFFu;
  void promote_frame_waiters(Tier tier, const BlockKey& key, TransferPriority to,
                             uint32_t layer = kAllLayers);
  void serve_memory_waiters();
  void make_room(Tier tier, TransferPriority prio);
  // Carries one planned move out; returns frames it freed at once or started freeing (drains).
  uint64_t execute_move(const PlannedMove& move, TransferPriority prio);
  void demote_page_to_host(const BlockKey& key, uint32_t layer, TransferPriority prio);
  // The rest of the completion of the demotions that landed in a batch (landed_), per block.
  void land_demotions();
  // Gives up requests still waiting for a host frame — only those of page `only`, or every one —
  // and returns how many. HBM demotions: each page stays in HBM, ready, as nothing was copied
  // yet. With kDemotionsAndReads, reads from NVMe too: a prefetch's ends unstarted (a step that
  // wants the page asks again, as a demand); a step's fails the step with kUnavailable, and the
  // engine may begin it again once it has freed something. Done for a page a step reads (better
  // not moved at all), and when host memory is full of pages that cannot move: those frames
  // might never come. The demotions waiting for them held HBM frames no plan could count on and
  // blocked every request queued behind them; prefetches of pages no step may read again (the
  // next step's first layers, loaded as a windowed step ends) kept the scheduler busy for good;
  // and a step whose read from NVMe waited for host frames (a copy of its block had failed, and
  // only the engine could free a frame) waited out its timeout (wide-sweep seed 9620).
  enum class Withdrawn : uint8_t { kDemotions, kDemotionsAndReads };
  std::size_t withdraw_host_requests(const PageKey* only, Withdrawn what, std::string_view why);
  // Starts writing the block (every page ready in host memory) to NVMe; false when it cannot
  // (not all in host, already going, NVMe full of blocks that cannot leave). `keep_host`: its host
  // pages stay (write-through, persisting); otherwise they leave host memory once written.
  // `drop_hbm`: once written, its HBM pages no step pins leave HBM too (stage_to_nvme).
  bool demote_block_to_nvme(const BlockKey& key, TransferPriority prio, bool keep_host,
                            bool drop_hbm = false);
  void write_through(const BlockKey& key, TierMask tiers);
  // Watermarks. Engine calls that may push a tier past its high watermark (end_layer, end_step,
  // unpin_prefix) only ask for a check: the plan and its moves run as the loop's own tasks, off
  // the engine's call. A plan's moves run a slice per task (kWatermarkMovesPerTurn), so an engine
  // call that comes meanwhile waits for one slice, not for the whole plan, and tiers are planned
  // one after another, each once the moves of the one above have started (HBM's demotions fill
  // host memory before host memory's plan). A check asked while a plan's moves are still running
  // plans again once they are done: the state it would see is the one they leave.
  void want_watermark_check();
  void run_watermark_turn();
  // Plans the moves that bring `tier` back to its low watermark (none below its high one).
  std::vector<PlannedMove> plan_watermark(Tier tier);
  void after_change(const BlockKey& key);  // evictor membership, erase of empty blocks
  void sync_membership(const BlockKey& key, Tier tier);
  bool may_lose_last_copy(const BlockKey& key, Tier tier) const;
  // Every page of the block has a ready copy in a tier faster than `tier` (EntryView::shadowed).
  bool shadowed_in(const BlockKey& key, Tier tier) const;
  void attach(const PageKey& page, Done done);
  // Reads the block from NVMe into host memory unless a read is in flight or a copy is there; a
  // read in flight at a lower priority moves up to `prio`. `hinted`: the read is a waiting
  // request's hint's (PageOp::hinted).
  void ensure_block_in_host(const BlockKey& key, TransferPriority prio, bool hinted = false);
  // What a read from NVMe that the store would not start fails with (see the definition).
  Status nvme_read_not_started(const BlockKey& key, const Status& why);
  // A read from NVMe of layers [first_layer, first_layer + count) of `key` whose turn on the link
  // comes while reads are paused, and that only prefetches wait for (a hint, a pinned prefix,
  // the next step's first layers): it ends unstarted, `finished` called, its host frames back,
  // the block's NVMe copy kept (a failed read would drop it), and its waiters told it was
  // cancelled. Returns false, doing nothing, for any other read: a step, or a sequence just
  // opened, has no other way to its block.
  bool skip_paused_prefetch(const BlockKey& key, uint32_t first_layer, uint32_t count,
                            const std::function<void()>& finished);
  // The host frames of a read from NVMe that failed. Its copies are given up at once, and the
  // table holds their frames until the port says the read no longer writes them (FramesReleased:
  // a read a hung drive holds fails at the I/O timeout and lets them go when the drive answers).
  struct FailedRead {
    std::vector<uint32_t> frames;  // held by the table; empty when the read succeeded
  };
  // Gives up the read's host copies of layers [first_layer, first_layer + count) of `key`, their
  // frames held (SchedulerStats::host_frames_held counts them); release_read_frames frees them.
  void hold_read_frames(FailedRead& read, const BlockKey& key, uint32_t first_layer,
                        uint32_t count);
  void release_read_frames(FailedRead& read);
  PageSnapshot page_snapshot(const BlockKey& key, uint32_t layer) const;
  void drop_nvme_copy(const BlockKey& key);
  // After `tier` could not store `key` (`why`): remembers it, says so once, and drops the copies
  // that could not go down (HBM pages for the host, host pages for NVMe) when nothing needs them.
  void refused_by_tier(const BlockKey& key, Tier tier, const Status& why);
  // The block may be written to NVMe: there is an NVMe tier, the block has a content key (the
  // store is addressed by it; a private block has none yet) and NVMe never refused it.
  bool nvme_takes(const BlockKey& key) const {
    return nvme_writable() && !key.is_private() && !refused(key, Tier::kNvme);
  }
  // There is an NVMe tier and writes to it are not paused (NvmeHealth): blocks in use may leave
  // memory by way of NVMe.
  bool nvme_writable() const { return parts_.nvme != nullptr && nvme_write_health_.usable(); }
  // Reads from NVMe are not paused: compute-or-load may reuse a block found only there, and hints
  // may read one.
  bool nvme_readable() const { return nvme_read_health_.usable(); }
  // How a write to NVMe ended, for NvmeHealth: `written` OK, or its failure. A failure of the
  // disk's (not a block NVMe cannot encode, not a cancelled write) may pause writing there; while
  // paused nothing is planned toward NVMe, and open steps that fitted only with blocks bound
  // there fail (fail_steps_that_no_longer_fit).
  void note_nvme_write(const Status& written);
  // The pause is over (its timer): writes go again, and what waited for them is planned again.
  void resume_nvme_writes();
  // A write succeeded after an outage: the blocks its failures refused may go to NVMe again.
  void lift_disk_refusals();
  // How a read from NVMe ended, for NvmeHealth: `read` OK, or its failure. Failures of the disk's
  // (an I/O error, bytes that fail their checksum) may pause reading there.
  void note_nvme_read(const Status& read);
  // The read pause is over (its timer): prompts may reuse blocks from NVMe again.
  void resume_nvme_reads();
  // Retires in the table's NVMe allocator as many free extents as the store retired since the
  // last call (bad sectors; TransferPort::nvme_retired_extents), so plans count only the extents
  // left in service; fails the open steps that no longer fit. Returns how many it retired. When
  // every extent holds a block, the rest are retired by a later call, once extents are freed.
  // When the store retires fewer than the table (a drive readmitted), puts as many back in
  // service instead, and returns 0.
  uint64_t take_retired_nvme_extents();
  // Forgets the NVMe copies of the blocks the store dropped with a dead drive
  // (TransferPort::take_lost_nvme_blocks); those read or written right now wait for a later call.
  void forget_lost_nvme_blocks();
  bool refused(const BlockKey& key, Tier tier) const {
    if (refused_.empty()) return false;  // the common case: asked per room-making candidate
    auto it = refused_.find(key);
    return it != refused_.end() && (it->second & (1u << tier_index(tier))) != 0;
  }
  // The blocks NVMe refused, for the placement (Placement::set_nvme_refuses).
  struct NvmeRefuses {
    const Scheduler* scheduler;
    bool operator()(const BlockKey& key) const { return scheduler->refused(key, Tier::kNvme); }
  };
  // Blocks the placement must leave alone when it plans room in `tier` (SkipFilter::operator()).
  struct SkipFilter {
    const Scheduler* scheduler;
    Tier tier;
    // Blocks already tried in this round of room-making (their move freed nothing now).
    const std::unordered_set<BlockKey, BlockKeyHash>* tried = nullptr;
    bool operator()(const BlockKey& key) const;
  };
  // One SkipFilter per tier, for a plan whose room cascades into the tiers below (the filters
  // point into this object, which must outlive the plan).
  struct SkipFilters {
    explicit SkipFilters(const Scheduler* s,
                         const std::unordered_set<BlockKey, BlockKeyHash>* tried = nullptr)
        : hbm{s, Tier::kHbm, tried}, host{s, Tier::kHost, tried}, nvme{s, Tier::kNvme, tried} {}
    SkipFilters(const SkipFilters&) = delete;
    SkipFilters& operator=(const SkipFilters&) = delete;
    TierFilters per_tier() const { return {KeyFilter(hbm), KeyFilter(host), KeyFilter(nvme)}; }
    SkipFilter hbm, host, nvme;
  };
  // The frames each tier can give a plan for room in `asked`: free and already draining, and in
  // every other tier (where the plan's victims go) less what is spoken for there — its reserve and
  // the frames requests already wait for. Counting those, a plan demoted pages into frames
  // that would never be theirs, and its room never came.
  std::array<uint64_t, kNumTiers> room_for_plans(Tier asked) const;
  // No host frame is free beyond the reserve and none is on its way (draining to NVMe): HBM
  // demotions waiting for a host frame wait until the engine frees one.
  bool host_has_nothing_for_demotions() const;
  // Host memory has room for every HBM page of `key` it lacks (room_for_plans of HBM).
  bool host_takes_demotion_of(const BlockKey& key) const;
  // Requests waiting for a frame of `tier` (HBM, host), every priority.
  uint64_t frames_awaited(Tier tier) const;
  struct PrefixPin {
    std::vector<BlockKey> keys;
    TimerId timer = 0;
  };
  bool host_pages_stuck(const BlockKey& key) const;
  // Copies HBM page `layer` of `key`, pinned in `hbm_frame`, into `host_frame` (its host fill
  // begun), through the batcher; then unpins it, completes or aborts the host copy, and once its
  // batch has landed (land_demotions, the block's host membership synced) calls done(copied).
  void copy_pinned_page_down(const BlockKey& key, uint32_t layer, uint32_t hbm_frame,
                             uint32_t host_frame, TransferPriority prio,
                             std::function<void(bool)> done);
  void finish_op(const PageKey& page, const Status& status);
  // Ends the ops of `pages` (those in flight), then tells each one's waiters.
  void finish_ops(std::span<const PageKey> pages, const Status& status);
  // What an ended op owes: its waiters told, a prefetch counted, a private block looked at again.
  void tell_waiters(const PageKey& page, PageOp& op, const Status& status);
  // The host pages of every layer of `key` (a whole-block transfer's ops).
  std::vector<PageKey> host_pages_of(const BlockKey& key) const;
  Evictor* evictor(Tier tier) const { return evictors_[tier_index(tier)].get(); }
  FrameAllocator* frames(Tier tier) const;
  // What the policies are told about a block when it enters a tier (BlockFacts' request fields).
  struct RequestFacts {
    uint32_t depth = 0;               // blocks before it in its chain
    uint32_t request_hit_blocks = 0;  // cached prefix of the request that brought it
    uint32_t request_blocks = 0;      // blocks of that request
  };
  RequestFacts facts_of(const BlockKey& key) const;

  SchedulerParts parts_;
  SchedulerOptions options_;
  SchedulerStats stats_;
  LinkQueues links_;
  CopyBatcher batcher_;  // page copies between HBM and host memory, batched per loop turn
  // Pages whose demotion to host memory landed in the batch completing now: land_demotions does
  // the rest of their completion, once per block.
  std::vector<PageKey> landed_;
  // Copies down of pinned pages completed in that batch, whose callers land_demotions tells.
  struct CopiedDown {
    BlockKey key;
    bool ok = false;
    std::function<void(bool)> done;
  };
  std::vector<CopiedDown> copied_down_;
  HintBoard hints_;
  std::array<std::unique_ptr<Evictor>, kNumTiers> evictors_;
  std::unique_ptr<WriteStrategy> write_;
  std::unique_ptr<NvmeAdmission> admission_;
  std::unique_ptr<Placement> placement_;
  NvmeRefuses nvme_refuses_{this};  // the placement's view of refused_

  std::unordered_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  std::unordered_map<StepId, std::unique_ptr<Step>> steps_;
  SequenceId next_sequence_ = 0;
  StepId next_step_ = 0;

  // Fills in flight, by page copy (HBM/host page, or NVMe block with layer kWholeBlock).
  std::unordered_map<PageKey, std::unique_ptr<PageOp>, PageKeyHash> ops_;
  // Requests waiting for a frame, per tier (HBM, host), by priority.
  std::array<std::array<std::deque<FrameWaiter>, kNumPriorities>, 2> waiters_;
  // Watermark checks (want_watermark_check): a turn task is posted; a check was asked and not
  // begun; the tier the running check plans next (kNumTiers: none running); the moves of its
  // last plan not carried out yet.
  bool watermark_turn_posted_ = false;
  bool watermark_check_wanted_ = false;
  std::size_t watermark_next_tier_ = kNumTiers;
  std::deque<PlannedMove> watermark_moves_;
  bool watermark_stopped_ = false;  // stop_watermark_checks
  // Frames that started draining and will be freed (per tier), so room is not planned twice.
  std::array<uint64_t, kNumTiers> draining_{};
  // Of HBM's draining frames, the demotions still waiting for their host frame (room_for_plans).
  uint64_t demotions_awaiting_host_ = 0;
  std::array<bool, kNumTiers> serving_{};  // serve_frame_waiters is running for that tier
  // Staging requests for reserve host frames (served before every other host request).
  std::deque<FrameWaiter> staging_waiters_;
  std::unordered_set<BlockKey, BlockKeyHash> staging_;  // blocks being staged for NVMe
  // Facts of blocks in the page table, learned from the requests that used them.
  std::unordered_map<BlockKey, RequestFacts, BlockKeyHash> facts_;
  // Full blocks waiting to be published (see publish_full_blocks).
  struct PendingPublish {
    SequenceId sequence = 0;
    uint64_t index = 0;
    BlockKey private_key;
    BlockKey content;
    // The sequence closed first: this entry holds the block's reference now, and publishes the
    // block (or drops it, when another copy was cached meanwhile) on its own.
    bool orphaned = false;
  };
  std::vector<PendingPublish> pending_publish_;
  // Copies being read by a transfer (host pages copied up or written to NVMe, HBM pages copied
  // down by write-through): the frame must not be reused until the read ends. Blocks with any page
  // in here are skipped by the placement.
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> reading_;
  // While begin_step plans a step's layers: the pins it took ahead of the page it is at, which
  // make_room gives back before it plans (ResidentPins). Null otherwise.
  ResidentPins* pins_ahead_ = nullptr;
  // What pins_ahead_ points to, kept from step to step so that its buffers (a megabyte of frames
  // for a large batch) are not allocated and faulted in again for every step.
  std::unique_ptr<ResidentPins> resident_pins_;
  // HBM pages of refilled blocks (Step::refilled) the engine is writing, with the readers that
  // wait for the write to end (they retry ensure_in_hbm then).
  std::unordered_map<PageKey, std::vector<std::function<void()>>, PageKeyHash> engine_writes_;
  // HBM pages whose load failed while a step had them pinned: still filling (a pinned page
  // cannot be aborted), holding whatever the failed copy left. Never served; aborted as soon as
  // the last pin goes (abort_failed_fills).
  std::unordered_set<PageKey, PageKeyHash> failed_fills_;
  // Prefix pins, and how many pins protect each block (kept in HBM: never an HBM victim).
  std::unordered_map<uint64_t, PrefixPin> prefix_pins_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> protected_;
  uint64_t next_pin_ = 0;
  // Blocks a slower tier could not store (an fp8 tier cannot encode NaN or inf; an NVMe write
  // failed), as a bit per tier: they leave the faster tier only by being dropped, when nothing
  // needs them (execute_move), and are not sent to that tier again — but for NVMe refusals of a
  // failing disk (kRefusedByFailingDisk), lifted when writes succeed after a pause.
  static constexpr uint8_t kRefusedByFailingDisk = 0x80;
  std::unordered_map<BlockKey, uint8_t, BlockKeyHash> refused_;
  // Blocks in use whose NVMe read failed (note_if_lost); a sequence reading one recomputes it
  // when a page has no copy left (recompute_lost_blocks). Erased once no sequence holds the block
  // (release_sequence_block), or with the entry.
  std::unordered_set<BlockKey, BlockKeyHash> lost_blocks_;
  // Whether writes to NVMe, and reads, are paused after failing, and the timers that end the
  // pauses (0: none).
  // Blocks the store lost that were being read or written when it said so
  // (forget_lost_nvme_blocks).
  std::vector<BlockKey> lost_nvme_later_;
  NvmeHealth nvme_write_health_;
  NvmeHealth nvme_read_health_;
  TimerId nvme_write_resume_timer_ = 0;
  TimerId nvme_read_resume_timer_ = 0;

  // What engine threads read without the loop: per step, its layers' readiness and tables.
  mutable std::mutex published_mu_;
  std::unordered_map<StepId, std::shared_ptr<PublishedStep>> published_;
};

}  // namespace kvtier
