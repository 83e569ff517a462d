// The packed in-memory record of one block in the page table (internal to the page table).
//
// One entry is a fixed-stride run of bytes in a shard's slab, laid out struct-of-arrays so that a
// block at 32 layers costs 416 bytes:
//
//   BlockHeader (96 B) | hbm_frame[layers] u32 | host_frame[layers] u32 | page_meta[layers] u16
//
// page_meta packs, per page: HBM copy state (bits 0-1), host copy state (bits 2-3) and the pin
// count of the HBM copy (bits 4-15, at most kMaxPins). The header keeps running counts over the
// pages (copies per tier, ready pages, pinned pages) so that match() and eviction scans decide per
// block in O(1) instead of walking `layers` pages; every page transition updates them and audit()
// recomputes them. It also keeps block pins: pins that hold every HBM page at once, taken only
// while every page is ready there (a step that reads all layers), so that such a step pins and
// unpins a block in O(1) instead of once per page. A page's pins are its own plus its block's.
// Two flags mark copies a waiting request's hint brought in (HBM pages, or the block read from NVMe
// into host memory) that no request has reused since; they go when those copies do, so the
// scheduler can tell speculative loads that paid off from those that were evicted unused.
//
// An EntryRef is a non-owning view of those bytes; it is only valid while the shard that owns the
// slab is locked and until that slab grows or the slot is released. Rejected: array-of-structs
// 12-byte page records (aligned, but 20% larger at 32 layers for no faster access), and a separate
// heap object per block (an allocation per block and a pointer chase per lookup).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvtier/block_key.hpp"
#include "scheduler/copy_state.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {

struct BlockHeader {
  static constexpr uint8_t kLive = 1;         // the slot holds a block (a free slot has 0)
  static constexpr uint8_t kLinked = 2;       // counted in its parent's cached_children
  static constexpr uint8_t kHasChecksum = 4;  // `checksum` was set
  // A hint's prefetch loaded HBM pages of the block, and no request has reused it since: cleared
  // by reuse, and when the block's last HBM copy goes.
  static constexpr uint8_t kHintedIntoHbm = 8;
  // A hint's prefetch read the block from NVMe into host memory, and no request has reused it
  // since: cleared by reuse, and when the block's last copy in memory (host or HBM) goes.
  static constexpr uint8_t kHintedIntoHost = 16;

  BlockKey key;
  BlockKey parent;
  uint64_t nvme_generation;
  uint64_t checksum;
  uint64_t last_access;  // table tick of the latest hit or touch
  uint64_t inserted;     // table tick of creation
  uint32_t nvme_extent;
  uint32_t refcount;
  uint32_t cached_children;
  uint32_t hits;
  uint16_t hbm_copies;    // pages whose HBM state is not absent
  uint16_t host_copies;   // pages whose host state is not absent
  uint16_t hbm_ready;     // pages ready in HBM
  uint16_t mem_ready;     // pages ready in HBM or in host memory
  uint16_t pinned_pages;  // pages with at least one pin of their own (page_meta)
  uint16_t block_pins;    // pins on every HBM page at once (each page is ready while any is held)
  uint8_t nvme_state;
  uint8_t flags;

  bool live() const { return (flags & kLive) != 0; }
};
static_assert(sizeof(BlockHeader) == 96, "BlockHeader layout changed: update the memory figures");

// Page meta bit layout.
constexpr uint16_t kMaxPins = 0x0FFF;       // a page's own pins
constexpr uint16_t kMaxBlockPins = 0xFFFF;  // a block's

constexpr CopyState meta_hbm_state(uint16_t m) { return static_cast<CopyState>(m & 3u); }
constexpr CopyState meta_host_state(uint16_t m) { return static_cast<CopyState>((m >> 2) & 3u); }
constexpr uint32_t meta_pins(uint16_t m) { return m >> 4; }
constexpr uint16_t make_meta(CopyState hbm, CopyState host, uint32_t pins) {
  return static_cast<uint16_t>(static_cast<uint32_t>(hbm) | (static_cast<uint32_t>(host) << 2) |
                               (pins << 4));
}

// Byte offsets of one entry's arrays for a given layer count.
struct EntryLayout {
  uint32_t layers = 0;
  uint32_t hbm_offset = 0;
  uint32_t host_offset = 0;
  uint32_t meta_offset = 0;
  uint32_t stride = 0;  // multiple of 8

  static constexpr EntryLayout for_layers(uint32_t layers) {
    EntryLayout l;
    l.layers = layers;
    l.hbm_offset = sizeof(BlockHeader);
    l.host_offset = l.hbm_offset + 4 * layers;
    l.meta_offset = l.host_offset + 4 * layers;
    l.stride = (l.meta_offset + 2 * layers + 7u) & ~7u;
    return l;
  }
};

class EntryRef {
 public:
  EntryRef(std::byte* base, const EntryLayout& layout) : base_(base), layout_(&layout) {}

  BlockHeader& header() const { return *reinterpret_cast<BlockHeader*>(base_); }
  uint32_t layers() const { return layout_->layers; }
  std::byte* bytes() const { return base_; }
  uint32_t stride() const { return layout_->stride; }

  uint32_t hbm_frame(uint32_t layer) const { return load<uint32_t>(layout_->hbm_offset, layer); }
  uint32_t host_frame(uint32_t layer) const { return load<uint32_t>(layout_->host_offset, layer); }
  uint16_t meta(uint32_t layer) const { return load<uint16_t>(layout_->meta_offset, layer); }
  void set_hbm_frame(uint32_t layer, uint32_t f) const { store(layout_->hbm_offset, layer, f); }
  void set_host_frame(uint32_t layer, uint32_t f) const { store(layout_->host_offset, layer, f); }
  void set_meta(uint32_t layer, uint16_t m) const { store(layout_->meta_offset, layer, m); }

  // A fresh live block: every copy absent, no pins, no references.
  void initialize(const BlockKey& key, const BlockKey& parent, uint64_t tick) const {
    BlockHeader h{};
    h.key = key;
    h.parent = parent;
    h.nvme_extent = FrameAllocator::kNoFrame;
    h.nvme_state = static_cast<uint8_t>(CopyState::kAbsent);
    h.last_access = tick;
    h.inserted = tick;
    h.flags = BlockHeader::kLive;
    std::memcpy(base_, &h, sizeof(h));
    for (uint32_t l = 0; l < layers(); ++l) {
      set_hbm_frame(l, FrameAllocator::kNoFrame);
      set_host_frame(l, FrameAllocator::kNoFrame);
      set_meta(l, make_meta(CopyState::kAbsent, CopyState::kAbsent, 0));
    }
  }

 private:
  // memcpy keeps the accesses free of alignment and aliasing assumptions; it compiles to one move.
  template <typename T>
  T load(uint32_t offset, uint32_t index) const {
    T v;
    std::memcpy(&v, base_ + offset + sizeof(T) * index, sizeof(T));
    return v;
  }
  template <typename T>
  void store(uint32_t offset, uint32_t index, T v) const {
    std::memcpy(base_ + offset + sizeof(T) * index, &v, sizeof(T));
  }

  std::byte* base_;
  const EntryLayout* layout_;
};

}  // namespace kvtier
