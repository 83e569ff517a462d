// EntryView: the checked, mutable view of ONE page-table entry that every transition goes through.
//
// A view exists only while the entry's shard mutex is held: PageTable builds one inside its
// targeted methods and hands one to the callback of PageTable::update/visit. It never outlives that
// call and must not be stored. Each transition checks legality first (copy-state diagram in
// scheduler/copy_state.hpp) and returns a Status that names the block key, layer, tier and states
// when it is illegal; an illegal transition changes nothing. Frames are allocated from and returned
// to the tiers' allocators inside the transitions (absent->filling allocates; filling->absent,
// draining->absent and ready->absent free), so a frame is owned by exactly one copy or is free.
//
// Inside PageTable::update the view runs in transactional mode: frees are deferred until the
// callback returns OK, and on an error the entry's bytes are restored and the frames it allocated
// are returned, so a compound update is all-or-nothing. The allocators are lock-free and may be
// called under the shard lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "scheduler/block_entry.hpp"
#include "scheduler/copy_state.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {

// The allocators the page table takes frames from. Not owned; they must outlive the table, and the
// table must be their only user (audit() checks that every allocated frame belongs to one copy).
// A null allocator is a tier that is not configured: filling a copy there fails with kUnavailable.
struct TierAllocators {
  FrameAllocator* hbm = nullptr;
  FrameAllocator* host = nullptr;
  ExtentAllocator* nvme = nullptr;
};

// What the eviction policies read about a block. Ticks come from the table's logical clock.
struct AccessStats {
  uint64_t last_access = 0;  // tick of the latest hit (match) or touch
  uint64_t inserted = 0;     // tick of creation
  uint32_t hits = 0;         // times match() counted this block in a prefix (saturates)
  friend bool operator==(const AccessStats&, const AccessStats&) = default;
};

// Copies of a block that a waiting request's hint brought in ahead of the request, and that no
// request has reused since (BlockHeader::kHintedIntoHbm, kHintedIntoHost).
struct HintedCopies {
  bool hbm = false;   // HBM pages a hint's prefetch loaded
  bool host = false;  // the block, read from NVMe into host memory by a hint's prefetch
  friend bool operator==(const HintedCopies&, const HintedCopies&) = default;
};

class EntryView {
 public:
  EntryView(const EntryView&) = delete;
  EntryView& operator=(const EntryView&) = delete;

  // ---- Reads. An invalid CopyId reads as an absent copy without a frame. ----
  const BlockKey& key() const { return entry_.header().key; }
  const BlockKey& parent() const { return entry_.header().parent; }
  uint32_t layers() const { return entry_.layers(); }
  CopyState state(const CopyId& copy) const;
  // The frame (HBM, host) or extent (NVMe) of a copy that is not absent; FrameAllocator::kNoFrame
  // otherwise.
  uint32_t frame(const CopyId& copy) const;
  uint32_t pins(uint32_t layer) const;
  uint64_t nvme_generation() const { return entry_.header().nvme_generation; }
  uint32_t refcount() const { return entry_.header().refcount; }
  uint32_t cached_children() const { return entry_.header().cached_children; }
  // True when the block is counted in its parent's cached_children (its parent was in the table
  // when it was created).
  bool linked() const { return (entry_.header().flags & BlockHeader::kLinked) != 0; }
  std::optional<uint64_t> checksum() const;
  AccessStats stats() const;
  // Pages with at least one pin: every page while the block is pinned whole (block_pins).
  uint32_t pinned_pages() const {
    return entry_.header().block_pins != 0 ? layers() : entry_.header().pinned_pages;
  }
  uint32_t block_pins() const { return entry_.header().block_pins; }
  HintedCopies hinted() const;
  // Pages whose copy in `tier` is not absent (for NVMe: 0 or `layers`, the extent holds them all).
  uint32_t copies(Tier tier) const;
  uint32_t hbm_ready_pages() const { return entry_.header().hbm_ready; }
  // Pages with a ready copy in HBM or host memory.
  uint32_t memory_ready_pages() const { return entry_.header().mem_ready; }
  // Cached: every page has a ready copy in some tier, or the NVMe extent is ready.
  bool cached() const { return match_tier().has_value(); }
  // The slowest tier a cached block must be loaded from: hbm when every page is ready in HBM, host
  // when every page is ready in HBM or host, else nvme; nullopt when not cached.
  std::optional<Tier> match_tier() const;
  // Shadowed in `tier` (host or NVMe): every page has a ready copy in a faster tier, so the copy
  // in `tier` could go without losing the block. Never true for HBM.
  bool shadowed(Tier tier) const;
  // Dirty: the NVMe copy is not ready while some page holds valid data (ready or draining) in HBM
  // or host memory, i.e. losing the memory tiers would lose the block.
  bool dirty() const;

  // ---- Transitions (see the diagram in copy_state.hpp). ----
  // absent -> filling. Allocates a frame (an extent for NVMe) and returns it; for NVMe also stamps
  // a new generation (read it with nvme_generation()).
  Result<uint32_t> begin_fill(const CopyId& copy);
  Status complete_fill(const CopyId& copy);  // filling -> ready
  Status abort_fill(const CopyId& copy);     // filling -> absent, frees; not while pinned
  // filling -> absent, the frame kept allocated and returned: a transfer may still write it
  // (PageTable::abandon_fill holds it); not while pinned.
  Result<uint32_t> abandon_fill(const CopyId& copy);
  Status begin_drain(const CopyId& copy);     // ready -> draining; not while pinned
  Status complete_drain(const CopyId& copy);  // draining -> absent, frees
  Status cancel_drain(const CopyId& copy);    // draining -> ready
  Status drop(const CopyId& copy);            // ready -> absent, frees; not while pinned
  // Pins the HBM copy of `layer` (filling or ready) and returns its frame.
  Result<uint32_t> pin(uint32_t layer);
  Status unpin(uint32_t layer);
  // The batched forms behind PageTable::pin_layers and unpin_layers, for layers
  // [first, first + count), which the caller has checked lie within the block. pin_range pins
  // every page or none: each must be ready (or, unless `ready_only`, filling) and below the most
  // pins; it writes the frame of layer first + c to frames[c * stride] and returns true, or returns
  // false having changed nothing (pin() on each page says why). unpin_range unpins every pinned
  // page and returns the first layer that was not pinned, or first + count when all were.
  bool pin_range(uint32_t first, uint32_t count, bool ready_only, uint32_t* frames,
                 std::size_t stride);
  uint32_t unpin_range(uint32_t first, uint32_t count);
  // Block pins: one count that pins every HBM page, taken only when every page is ready there (and
  // the pages stay ready while any is held: a pinned page is neither drained nor dropped).
  // pin_block writes the frame of layer l to frames[l] and returns true, or returns false
  // having changed nothing (a page not ready in HBM, or the most block pins). unpin_block returns
  // false when the block has no block pin. split_block_pin turns one block pin into pins of pages
  // [first, first + count) of their own, releasing the others, or returns false having changed
  // nothing (no block pin, or a page in the range at the most pins of its own).
  bool pin_block(uint32_t* frames);
  bool unpin_block();
  bool split_block_pin(uint32_t first, uint32_t count);
  // Drops every ready, unpinned copy in `tier` and returns how many were dropped; copies in
  // flight (filling, draining) and pinned pages are left alone.
  Result<uint32_t> drop_all(Tier tier);

  Status acquire();            // refcount + 1
  Result<uint32_t> release();  // refcount - 1, returns what is left; below zero is an error
  void set_checksum(uint64_t checksum);
  void clear_checksum();
  // Records an access for the eviction policies (last_access = a new tick of the table's clock).
  void touch();
  // Marks the block's copies in `tier` (HBM or host) as brought in by a hint. Returns true when it
  // marked them; false when they were marked already, when the tier holds no copy of the block
  // (nothing to mark), or when the block has references (a sequence holds it: what a hint brought
  // in for it is not speculative). The mark goes when the copies do (set_state) or when
  // take_hinted takes it.
  bool mark_hinted(Tier tier);
  // A request reuses the block: returns the marks, cleared.
  HintedCopies take_hinted();

 private:
  friend class PageTable;

  struct TierFrame {
    Tier tier;
    uint32_t frame;
  };
  // Transactional mode (PageTable::update): frames to free on commit, frames to return on abort.
  struct Undo {
    std::vector<TierFrame> frees;
    std::vector<TierFrame> allocations;
  };

  EntryView(EntryRef entry, const TierAllocators& allocators,
            std::atomic<uint64_t>* nvme_generations, std::atomic<uint64_t>* clock, Undo* undo)
      : entry_(entry),
        allocators_(allocators),
        nvme_generations_(nvme_generations),
        clock_(clock),
        undo_(undo) {}

  std::string describe(const CopyId& copy) const;
  Status check_copy(const CopyId& copy, const char* op) const;
  Status expect_state(const CopyId& copy, const char* op, CopyState expected) const;
  Status check_unpinned(const CopyId& copy, const char* op) const;
  void set_state(const CopyId& copy, CopyState next, uint32_t frame);
  Result<uint32_t> allocate_frame(const CopyId& copy);
  Status release_frame(Tier tier, uint32_t frame);

  EntryRef entry_;
  const TierAllocators& allocators_;
  std::atomic<uint64_t>* nvme_generations_;
  std::atomic<uint64_t>* clock_;
  Undo* undo_;
};

// Returns one frame to its tier's allocator; an error here means the table's ownership records
// are broken (the frame was not allocated), reported as kInternal.
Status free_tier_frame(const TierAllocators& allocators, Tier tier, uint32_t frame);

}  // namespace kvtier
