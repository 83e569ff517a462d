// PageTable: the concurrent map from block key to where each page of that block lives, in which
// state, and who is using it. Everything the scheduler and its policies decide is read from here.
//
// What it owns. One entry per block (scheduler/block_entry.hpp): per layer page, the HBM and host
// frame and the state of each copy; per block, the NVMe extent with its state and generation, a
// reference count (sequences sharing the block), pin counts per page and per whole block (steps
// reading it: a page's pins are its own plus its block's), a checksum
// slot, the parent key with a cached-children count, and access statistics. The table allocates and
// frees frames itself inside the transitions (copy-state diagram in scheduler/copy_state.hpp), from
// the tiers' allocators given at creation, so used + free = capacity holds by construction and
// audit() proves every allocated frame belongs to exactly one copy.
//
// Sharding and lock order. Entries are spread over a power of two of shards by the low bits of a
// mixed 64-bit hash of the key (mixed, because private keys are small sequence numbers). Each shard
// is a mutex guarding a flat open-addressing index (FlatKeyMap) and a slab of fixed-stride entries
// (EntrySlab). Lock order:
//   1. shard mutexes, in ascending shard index when two are needed (create_block and erase take
//      the block's and its parent's shard; publish takes the private and the content key's shard);
//      snapshot() and audit() take all of them in ascending order; match(), the batched pin calls
//      and scans hold one shard at a time;
//   2. the allocators are lock-free and are called under a shard lock;
//   3. nothing else: no I/O, no waiting, no call into other kvtier components under a shard lock.
// The callbacks of update() and visit() run under the entry's shard lock. They must be short, must
// not block and must not call back into the table (the shard mutex is not recursive). No other user
// code runs under a lock: scans copy candidates out first.
//
// What invalidates what. Nothing the table returns points into it: lookups, snapshots and scans
// return copies. A frame index stays owned by its copy until the transition that frees it
// (abort_fill, complete_drain, drop, drop_all, erase); the caller must have finished every transfer
// into or out of the frame before that transition. A fill whose transfer cannot be taken back (an
// NVMe read the drive holds past its I/O timeout) is abandoned instead: the copy becomes absent at
// once and the table holds its frame, allocated and counted by audit(), until the caller says the
// transfer let it go (release_held_frame). A pinned HBM page cannot be freed, drained or
// erased. A block with references, pins, copies in flight (filling or draining) or cached children
// cannot be erased; evict leaves first (a child is useless without its parent, and keeping parents
// while children exist is what keeps cached_children exact).
//
// Private blocks. The still-growing last block of a sequence lives under a private key (tag 0,
// private_block_key). When it is full, publish() moves it under its content key; if that key is
// already cached (another sequence computed the same block), publish changes nothing and says so,
// and the caller shares the existing block and erases the private one: a shared block is never
// duplicated. The table counts its private blocks (private_blocks()): their pages can live only in
// HBM and host memory, which the scheduler must know when it decides how much of HBM a step gets.
// For the same reason it counts its blocks with references (referenced_blocks()): without NVMe,
// the blocks of open sequences cannot leave memory either. The count changes wherever a reference
// count leaves or reaches zero (create_block, acquire, release, match with acquire, update).
//
// Rejected: one global lock (2 threads would already serialise on match), a lock-free table (no
// benchmark says the shard mutexes are the bottleneck, and a lock-free design would need a
// hand-verified state word per page), std::unordered_map per shard (a heap node per block and
// ~2x the metadata), and per-page heap records (a pointer chase per page in match).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "kvtier/step_types.hpp"
#include "kvtier/types.hpp"
#include "scheduler/block_entry.hpp"
#include "scheduler/copy_state.hpp"
#include "scheduler/entry_slab.hpp"
#include "scheduler/entry_view.hpp"
#include "scheduler/flat_key_map.hpp"
#include "scheduler/thread_annotations.hpp"

namespace kvtier {

struct PageTableOptions {
  static constexpr uint32_t kMaxLayers = 4096;
  static constexpr uint32_t kMaxShards = 1u << 16;

  uint32_t layers = 32;          // pages per block, 1..kMaxLayers
  uint32_t shards = 64;          // a power of two, 1..kMaxShards
  uint64_t expected_blocks = 0;  // presizes the indexes (0: grow on demand)
};

struct MatchOptions {
  bool record_hits = true;  // update last_access and hits of every matched block
  bool acquire = false;     // take a reference on every matched block, under the same lock
};

// MatchResult (the cached prefix and its blocks per tier) is in kvtier/step_types.hpp.

enum class PublishOutcome : uint8_t {
  kPublished = 0,      // the private block now lives under its content key
  kAlreadyCached = 1,  // the content key exists; nothing changed, share it and drop the private one
};

// A copy of one page's record.
struct PageInfo {
  CopyState hbm = CopyState::kAbsent;
  CopyState host = CopyState::kAbsent;
  uint32_t hbm_frame = FrameAllocator::kNoFrame;
  uint32_t host_frame = FrameAllocator::kNoFrame;
  uint32_t pins = 0;
  friend bool operator==(const PageInfo&, const PageInfo&) = default;
};

// A copy of one block's entry.
struct BlockInfo {
  BlockKey key;
  BlockKey parent;
  uint32_t refcount = 0;
  uint32_t cached_children = 0;
  bool linked = false;  // counted in the parent's cached_children
  std::optional<uint64_t> checksum;
  AccessStats stats;
  CopyState nvme = CopyState::kAbsent;
  uint32_t nvme_extent = FrameAllocator::kNoFrame;
  uint64_t nvme_generation = 0;
  bool dirty = false;
  std::optional<Tier> match_tier;  // nullopt: not cached
  uint32_t block_pins = 0;         // pins on every page at once (counted in each page's pins)
  HintedCopies hinted;             // copies a hint brought in that no request has reused since
  std::vector<PageInfo> pages;
  friend bool operator==(const BlockInfo&, const BlockInfo&) = default;
};

// What an eviction policy needs to rank a block for one tier.
struct EvictionCandidate {
  BlockKey key;
  BlockKey parent;
  AccessStats stats;
  uint32_t refcount = 0;
  uint32_t cached_children = 0;
  uint32_t pinned_pages = 0;
  // Copies in the scanned tier that could be dropped or drained now: ready and (HBM) unpinned
  // pages, or 1 for a ready NVMe extent.
  uint32_t evictable = 0;
  bool dirty = false;
};

// Position of an incremental scan (scan_candidates); default = start of a pass.
struct ScanCursor {
  uint32_t shard = 0;
  uint32_t slot = 0;
};

class PageTable {
 public:
  static Result<std::unique_ptr<PageTable>> create(const PageTableOptions& options,
                                                   const TierAllocators& allocators);
  // Returns every frame the table still owns to its allocator. No other thread may use the table.
  ~PageTable();
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  uint32_t layers() const { return layout_.layers; }
  uint32_t shard_count() const { return shard_mask_ + 1; }
  // The logical clock behind AccessStats: advanced by every match, create_block and touch.
  uint64_t now() const { return clock_.load(std::memory_order_relaxed); }

  // ---- Blocks ----
  // A new block, absent in every tier, with `initial_refs` references. When `parent` is in the
  // table the block is counted in its cached_children. kAlreadyExists when `key` is present.
  Status create_block(const BlockKey& key, const BlockKey& parent, uint32_t initial_refs = 0);
  bool contains(const BlockKey& key) const;
  // Whether something references the block (refcount > 0): an open sequence, or a publish pending
  // for one, whose next step reads it. False for a key not in the table.
  bool referenced(const BlockKey& key) const;
  Result<BlockInfo> lookup(const BlockKey& key) const;
  // Removes a block with no references, pins, copies in flight or cached children; frees its ready
  // copies and uncounts it from its parent.
  Status erase(const BlockKey& key);
  // Moves a private block under its content key (see the header comment).
  Result<PublishOutcome> publish(const BlockKey& private_key, const BlockKey& content_key);
  // Number of blocks.
  std::size_t size() const;
  // Number of blocks under a private key (created private and not yet published or erased).
  uint64_t private_blocks() const { return private_blocks_.load(std::memory_order_relaxed); }
  // Number of blocks with at least one reference.
  uint64_t referenced_blocks() const { return referenced_blocks_.load(std::memory_order_relaxed); }

  // The longest prefix of `keys` whose blocks are all cached, counted by the slowest tier each must
  // be loaded from. Each block is checked (and, per options, hit-recorded and acquired) under its
  // own shard lock; the prefix as a whole is not one atomic snapshot.
  MatchResult match(std::span<const BlockKey> keys, const MatchOptions& options = {});

  // ---- References and statistics ----
  Status acquire(const BlockKey& key);
  // acquire() for a request that reuses the block: also takes (clears and returns) the marks of
  // copies a hint brought in for it (mark_hinted).
  Result<HintedCopies> acquire_for_reuse(const BlockKey& key);
  // Marks the block's copies in `tier` as brought in by a hint's prefetch (EntryView::mark_hinted);
  // true when newly marked.
  Result<bool> mark_hinted(const BlockKey& key, Tier tier);
  Result<uint32_t> release(const BlockKey& key);  // returns the references left
  Status touch(const BlockKey& key);
  Status set_checksum(const BlockKey& key, uint64_t checksum);

  // ---- Copy transitions (copy_state.hpp); each checks legality and changes nothing when illegal
  // ----
  Result<uint32_t> begin_fill(const BlockKey& key, const CopyId& copy);  // returns the frame
  Status complete_fill(const BlockKey& key, const CopyId& copy);
  Status abort_fill(const BlockKey& key, const CopyId& copy);
  // filling -> absent, the frame held by the table (not free) until release_held_frame; returns
  // it. For a transfer into the frame that may still write it after its copy is given up.
  Result<uint32_t> abandon_fill(const BlockKey& key, const CopyId& copy);
  // Frees a frame abandon_fill held. kFailedPrecondition, changing nothing, for one it does not.
  Status release_held_frame(Tier tier, uint32_t frame);
  // Frames of `tier` held by abandon_fill now.
  std::size_t held_frames(Tier tier) const;
  Status begin_drain(const BlockKey& key, const CopyId& copy);
  Status complete_drain(const BlockKey& key, const CopyId& copy);
  Status cancel_drain(const BlockKey& key, const CopyId& copy);
  Status drop(const BlockKey& key, const CopyId& copy);
  // Drops every ready, unpinned copy of the block in `tier`; returns how many.
  Result<uint32_t> drop_all(const BlockKey& key, Tier tier);

  // ---- Pins (HBM pages) ----
  Result<uint32_t> pin(const BlockKey& key, uint32_t layer);  // returns the HBM frame
  // Pins the page only if its HBM copy is ready, in one lookup, and returns its frame; nullopt,
  // changing nothing, when the block is unknown, the copy is not ready or the page has the most
  // pins it can. The step's fast path for a page already resident (no error text is built for
  // the pages that are not: the caller takes its general path for those).
  std::optional<uint32_t> pin_ready(const BlockKey& key, uint32_t layer);
  Status unpin(const BlockKey& key, uint32_t layer);
  // Pins pages [first_layer, first_layer + count) of every block in `keys` and writes their HBM
  // frames to `frames`, one block table per layer: frames[(layer - first_layer) * keys.size() + i].
  // Locks each shard once for all of its keys (a step pins thousands of pages; the lock round trip
  // would be most of a pin's cost). All or nothing: on an error every pin taken is released. A key
  // listed twice is pinned twice.
  Status pin_layers(std::span<const BlockKey> keys, uint32_t first_layer, uint32_t count,
                    std::span<uint32_t> frames);
  // Unpins the same pages; keeps going past errors and returns the first.
  Status unpin_layers(std::span<const BlockKey> keys, uint32_t first_layer, uint32_t count);
  // One layer: a step's block table for `layer`.
  Status pin_layer(std::span<const BlockKey> keys, uint32_t layer, std::span<uint32_t> frames);
  Status unpin_layer(std::span<const BlockKey> keys, uint32_t layer);
  // Where the entries of blocks pinned by pin_blocks_ready sit, shard by shard, so that whoever
  // pinned them unpins them again with no lookup per key: an entry with a pin is neither erased
  // nor moved. Each use still checks that the slot holds the key (and looks up a key whose slot
  // does not).
  struct PinnedEntries {
    struct Entry {
      uint32_t shard = 0;
      uint32_t slot = 0;
      BlockKey key;
    };
    std::vector<Entry> entries;  // in shard order
    bool empty() const { return entries.empty(); }
  };
  // Block pins (EntryView::pin_block): what a step that reads every layer takes, one count per
  // block instead of one per page (a decode step of 32 sequences x 4k tokens pins 8k blocks
  // instead of 262k pages). Each block of `keys` whose pages are all ready in HBM is pinned, its
  // frames written block by block (frames[i * layers() + layer]: the walk goes shard by shard, so
  // each block's frames are one run, not a write into every layer's table) and pinned[i] set to
  // 1; any other block (unknown, or a page not ready) is left as it was, with pinned[i] = 0.
  // Returns how many were pinned; kInvalidArgument (pinning nothing) for spans that do not fit.
  // `where`, when given, gets the entries of the blocks pinned (and loses what it held). A block
  // pin holds every page until unpin_blocks; it is told from a page's own pins (unpin_layers does
  // not release it).
  Result<uint32_t> pin_blocks_ready(std::span<const BlockKey> keys, std::span<uint32_t> frames,
                                    std::span<uint8_t> pinned, PinnedEntries* where = nullptr);
  // Releases one block pin of each block; keeps going past errors and returns the first.
  Status unpin_blocks(const PinnedEntries& where);
  // Turns one block pin of each block into pins of pages [first_layer, first_layer + count) of
  // their own (EntryView::split_block_pin). Returns the keys it could not split, in `keys`' order,
  // which keep their block pin: unknown, without a block pin, or with a page of the range at the
  // most pins of its own.
  Result<std::vector<BlockKey>> split_block_pins(std::span<const BlockKey> keys,
                                                 uint32_t first_layer, uint32_t count);

  // ---- Compound updates ----
  // Runs fn(EntryView&) -> Status under the block's shard lock. All or nothing: when fn returns an
  // error the entry is restored and frames it allocated are returned; frees take effect only when
  // fn succeeds. fn must not block or call into the table.
  template <typename Fn>
  Status update(const BlockKey& key, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    return update_erased(
        key, [](void* f, EntryView& view) -> Status { return (*static_cast<F*>(f))(view); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }
  // Runs fn(const EntryView&) under the block's shard lock (a consistent read of one entry).
  template <typename Fn>
  Status visit(const BlockKey& key, Fn&& fn) const {
    using F = std::remove_reference_t<Fn>;
    return visit_erased(
        key, [](void* f, const EntryView& view) { (*static_cast<F*>(f))(view); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // ---- Eviction scans ----
  // Appends up to `max` candidates for evicting from `tier` (blocks with at least one evictable
  // copy there), continuing from `cursor`, which it advances. Returns true when the pass reached
  // the end (the cursor is then back at the start). Locks one shard at a time, for a bounded
  // number of slots, and copies candidates out before the next lock.
  bool scan_candidates(Tier tier, ScanCursor& cursor, std::size_t max,
                       std::vector<EvictionCandidate>& out) const;
  // One whole pass.
  std::vector<EvictionCandidate> eviction_candidates(Tier tier) const;

  // ---- Checking ----
  // Every block, read under all shard locks at once (a consistent cut).
  std::map<BlockKey, BlockInfo> snapshot() const KVTIER_NO_THREAD_SAFETY_ANALYSIS;
  // Checks every invariant; call at a quiescent point (no transfers in flight that the caller has
  // not recorded). Allocators' own audits; used == frames owned by copies or held for abandoned
  // fills, per tier; each frame owned once and allocated; frames present exactly when a copy is not
  // absent; no pinned page that is absent or draining; per-block counters and the private- and
  // referenced-block counts equal to a recount; cached_children equal to the linked children
  // present, and every linked child's parent present; index and slabs agree.
  Status audit() const KVTIER_NO_THREAD_SAFETY_ANALYSIS;
  // Heap bytes held by the table's metadata (indexes, slabs, shard array, the table itself).
  std::size_t memory_bytes() const;

 private:
  struct alignas(64) Shard {
    mutable Mutex mu;
    FlatKeyMap map KVTIER_GUARDED_BY(mu);
    EntrySlab slab KVTIER_GUARDED_BY(mu);
  };
  class ShardPairLock;
  class AllShardsLock;
  // Scratch of the batched pin operations: keys' hashes and their indices grouped by shard.
  struct ShardGroups {
    std::vector<uint64_t> hash;
    std::vector<uint32_t> order;
    std::vector<uint32_t> start;  // [shards + 1]: order[start[s], start[s + 1]) is shard s
    std::vector<uint32_t> cursor;
  };
  static ShardGroups& thread_scratch();  // one per thread, reused across calls

  PageTable(const PageTableOptions& options, const TierAllocators& allocators);

  static uint64_t hash_key(const BlockKey& key);
  Shard& shard_for(uint64_t hash) const { return shards_[hash & shard_mask_]; }
  uint32_t shard_index(uint64_t hash) const { return static_cast<uint32_t>(hash & shard_mask_); }
  uint64_t tick() { return clock_.fetch_add(1, std::memory_order_relaxed) + 1; }

  uint32_t find_slot(const Shard& shard, uint64_t hash, const BlockKey& key) const
      KVTIER_REQUIRES(shard.mu);
  // A new slab slot of `shard`, indexed under `hash` (the caller writes its entry), or
  // resource_exhausted, "cannot <verb> block <key>: no memory for ...", when the slab or the index
  // cannot grow; nothing changes then.
  static Result<uint32_t> add_slot(Shard& shard, uint64_t hash, std::string_view verb,
                                   const BlockKey& key) KVTIER_REQUIRES(shard.mu);
  EntryRef entry_at(const Shard& shard, uint32_t slot) const KVTIER_REQUIRES(shard.mu) {
    return EntryRef(shard.slab.at(slot), layout_);
  }
  // Whether `slot` holds the live entry of `key` (PinnedEntries are checked so).
  bool slot_holds(const Shard& shard, uint32_t slot, const BlockKey& key) const
      KVTIER_REQUIRES(shard.mu);
  EntryView make_view(EntryRef entry, EntryView::Undo* undo) const {
    return EntryView(entry, allocators_, &nvme_generations_, &clock_, undo);
  }
  BlockInfo info_of(EntryRef entry) const;
  void group_by_shard(std::span<const BlockKey> keys, ShardGroups& groups) const;
  // The batched pin calls' walk: every key of `keys`, shard by shard, each shard locked once,
  // calling fn(i, view, shard, slot) with the entry of keys[i] and where it sits, or a null view
  // when the table has none. fn returns false to stop. Returns how many calls returned true before
  // that: the first ones in thread_scratch().order.
  template <typename Fn>
  std::size_t for_each_by_shard(std::span<const BlockKey> keys, Fn&& fn);
  // The walk of the calls given PinnedEntries: fn(view, key) for each entry still in its slot,
  // each shard locked once; returns the keys that were not (moved or gone), for a lookup.
  template <typename Fn>
  std::vector<BlockKey> for_each_pinned_entry(const PinnedEntries& where, Fn&& fn);
  // kInvalidArgument "<op> of layers [first, first + count): ..." past the blocks' layers.
  Status check_layer_range(const char* op, uint32_t first, uint32_t count) const;
  Status not_found_error(const BlockKey& key) const;

  // Keeps referenced_blocks_ when a block's reference count went from `before` to `after`.
  void count_references(uint32_t before, uint32_t after) {
    if (before == 0 && after > 0) referenced_blocks_.fetch_add(1, std::memory_order_relaxed);
    if (before > 0 && after == 0) referenced_blocks_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Runs op(EntryView&) on one entry under its shard lock, frees immediately (single transitions).
  template <typename Op>
  auto with_entry(const BlockKey& key, Op&& op) -> decltype(op(std::declval<EntryView&>()));

  Status update_erased(const BlockKey& key, Status (*call)(void*, EntryView&), void* fn);
  Status visit_erased(const BlockKey& key, void (*call)(void*, const EntryView&), void* fn) const;

  const EntryLayout layout_;
  const TierAllocators allocators_;
  const uint32_t shard_mask_;
  std::unique_ptr<Shard[]> shards_;
  mutable std::atomic<uint64_t> clock_{0};
  mutable std::atomic<uint64_t> nvme_generations_{0};
  std::atomic<uint64_t> private_blocks_{0};
  std::atomic<uint64_t> referenced_blocks_{0};
  // Frames of abandoned fills, per tier (a handful: reads a hung drive holds). Taken after a
  // shard lock, never before one.
  mutable Mutex held_mu_;
  std::array<std::vector<uint32_t>, kNumTiers> held_ KVTIER_GUARDED_BY(held_mu_);
};

}  // namespace kvtier
