// Private state of the Scheduler shared by its translation units (scheduler*.cpp). Loop thread
// only, except where a member says otherwise.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "scheduler/scheduler.hpp"

namespace kvtier {

struct Scheduler::Sequence {
  SequenceId id = 0;
  // The blocks holding the sequence's K/V, in chain order: content keys, and a private key for
  // blocks not yet published (the still-growing last one, or blocks without a known key).
  std::vector<BlockKey> blocks;
  // The prompt's keys as given to open_sequence: publish uses them for prompt blocks.
  std::vector<BlockKey> prompt_keys;
  uint64_t tokens = 0;         // tokens with K/V
  uint64_t next_private = 0;   // counter for private_block_key(id, n)
  StepId active_step = 0;      // 0 when not in a step
  uint32_t reused_blocks = 0;  // from open: blocks reused rather than prefilled
  bool started = false;        // a step has begun
  // Tokens of a reused prefix given up as late (prefetch.on_late = recompute), or of blocks given
  // up as lost to a failed NVMe read, that no step has recomputed yet: each begin_step reports
  // them as recomputed_tokens until one ends, so a begin_step that fails after giving them up, or
  // an aborted step, does not lose them.
  uint64_t owed_recompute = 0;
};

// Shared with engine threads: written by the loop before a layer is sealed; read after it is ready.
struct Scheduler::PublishedStep {
  std::vector<std::shared_ptr<LayerReadiness>> ready;
  std::vector<LayerTable> tables;
  Nanos stall_deadline = 0;  // a wait longer than this counts as a deadline miss
};

struct Scheduler::Step {
  StepId id = 0;
  uint32_t layers = 0;
  uint32_t window = 0;
  bool windowed = false;
  bool ended = false;
  Nanos begun = 0;
  std::vector<StepItemInfo> items;
  // Per item: the keys of the blocks it reads this step (after its appends), and the index of the
  // first block it writes into.
  std::vector<std::vector<BlockKey>> blocks;
  // Per item: how many of its leading blocks an earlier item holds too (shared_prefix_lengths);
  // the step holds a frame per layer for each of the others, window layers at a time
  // (Scheduler::frames_held).
  std::vector<uint32_t> shared_blocks;
  // What fit_window admitted the step with, asked again when a block in use can no longer leave
  // memory (Scheduler::fail_steps_that_no_longer_fit): HBM frames per layer, and its blocks kept
  // in memory.
  uint64_t needed_per_layer = 0;
  KeptBlocks kept;
  std::vector<uint32_t> first_written;
  std::shared_ptr<PublishedStep> shared;
  // Blocks created by this step (their pages are written by the engine, nothing to load).
  std::unordered_set<BlockKey, BlockKeyHash> new_blocks;
  // Those of new_blocks that are existing entries the step writes the HBM pages of (see
  // Scheduler::refillable); undoing the step releases them but never erases them.
  std::unordered_set<BlockKey, BlockKeyHash> refilled;
  // Per item, the sequence's token count before the step (to undo an aborted step).
  std::vector<uint64_t> tokens_before;
  // Per layer: the (block) pages this step pinned there one by one, unpinned as the layer ends;
  // and the blocks it holds by block pins (pin_resident_blocks), every page of each, to the end of
  // the step. So unpinning matches pinning exactly. The latter are kept as where their entries
  // sit: end_step unpins them with no lookup.
  std::vector<std::vector<BlockKey>> pinned;
  PageTable::PinnedEntries resident;
  std::vector<uint8_t> planned;
  std::vector<uint8_t> released;
};

// The blocks of a step that is not windowed that were resident in HBM in every layer when it
// began, pinned there whole by block pins (Scheduler::pin_resident_blocks: one count per block,
// not one per page). Per slot of plan_layer's order (the step's items, then each item's blocks):
// the block, whether it was pinned so, and its frames, one block table per layer
// (frames[layer * keys.size() + slot]).
//
// They stay pinned until the step ends, end_layer or not: the step was admitted as fitting in
// HBM, and a layer's pages released as it ended were what room-making at saturation took first,
// to load them back for the sequence's next step (the Mooncake trace at its recorded rate,
// kvtier-bench run: 18.9 TB host->HBM with them released per layer, 12.8 TB held).
//
// While begin_step plans its layers, the pins must change nothing but the cost: page by page, a
// room plan made for a page of layer L (a fill, a load) could still choose pages the order had not
// reached. So plan_layer keeps the page it is at in (layer, slot), and before any room is planned
// while they are held, Scheduler::give_back_pins_ahead turns the block pins into page pins of the
// layers reached; from there on every page takes plan_layer's page-by-page path, as before.
struct Scheduler::ResidentPins {
  Step* step = nullptr;
  std::vector<BlockKey> keys;
  std::vector<uint8_t> pinned;
  PageTable::PinnedEntries entries;  // of the pinned ones
  std::vector<uint32_t> frames;
  std::vector<uint32_t> frames_by_block;  // as the page table writes them (pin_blocks_ready)
  bool held = false;   // pins ahead of (layer, slot) are held: plan_layer reads `frames`
  uint32_t layer = 0;  // the page plan_layer is at
  std::size_t slot = 0;

  // Ready for another step, as if new, keeping the buffers' memory.
  void reset() {
    step = nullptr;
    keys.clear();
    pinned.clear();
    entries.entries.clear();
    held = false;
    layer = 0;
    slot = 0;
  }
};

// A transfer in flight for one copy (a fill, or the drain of a copy leaving its tier); those who
// need it attach `Done`s, run when it ends. Fills of HBM pages also tell attached steps the frame
// as soon as it is taken (`on_frame`), so they can pin it while it fills.
struct Scheduler::PageOp {
  JobId job = 0;
  bool prefetch = false;
  // A read from NVMe a sequence just opened wants: queued at kAdmitted at least, even where it
  // was issued as a hint's and raised while it still gathered its host frames.
  bool admitted = false;
  // Issued by a waiting request's hint: when it arrives, still a prefetch, the block's copies in
  // the tier are marked as the hint's unless a sequence holds the block by then
  // (EntryView::mark_hinted; SchedulerStats::hinted_loads).
  bool hinted = false;
  Nanos issued = 0;  // loop time the op was created (HBM prefetches are counted by it)
  bool drain = false;
  std::optional<uint32_t> frame;
  std::vector<Done> waiters;
  std::vector<std::function<void(uint32_t)>> on_frame;
};

// The few fields of a page or a block the move logic reads, taken under one shard lock (visit)
// without copying the whole entry.
struct PageSnapshot {
  bool found = false;
  CopyState hbm = CopyState::kAbsent;
  CopyState host = CopyState::kAbsent;
  CopyState nvme = CopyState::kAbsent;
  uint32_t hbm_frame = 0;
  uint32_t host_frame = 0;
  uint32_t pins = 0;
};

struct Scheduler::FrameWaiter {
  BlockKey key;
  uint32_t layer = 0;
  FrameGranted granted;
  FrameUse use = FrameUse::kCopy;
};

}  // namespace kvtier
