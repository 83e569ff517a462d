// The life cycle of one copy of KV data in one tier, and how a copy is named.
//
// A copy is either a page (one layer of one block) in HBM or in host memory, or a block's whole
// NVMe extent (its pages lie contiguously on disk, so the NVMe copy is per block). Every copy moves
// through the same four states; the page table checks each step and owns the frame allocation:
//
//   absent ──begin_fill──▶ filling ──complete_fill──▶ ready ──begin_drain──▶ draining
//    ▲  ▲                    │                         │  ▲                     │
//    │  └─────abort_fill─────┘                         │  └────cancel_drain─────┤
//    ├──────────────────────────drop───────────────────┘                        │
//    └──────────────────────────complete_drain──────────────────────────────────┘
//
//   from      operation       to        frame      refused while the HBM page is pinned
//   absent    begin_fill      filling   allocated
//   filling   complete_fill   ready
//   filling   abort_fill      absent    freed      yes
//   ready     begin_drain     draining             yes
//   draining  cancel_drain    ready
//   draining  complete_drain  absent    freed      yes (a draining page cannot be pinned)
//   ready     drop            absent    freed      yes
// Every other (state, operation) pair is illegal: kFailedPrecondition, and nothing changes.
//
// filling: a transfer or the engine is writing the frame; its bytes are not yet a valid copy.
// ready:   a complete, valid copy; match() counts it.
// draining: still valid, but leaving (written out or about to be dropped); no new pins.
// Pins apply to HBM pages only (a step reads or writes the frame) and are legal on filling and
// ready pages; a pinned page cannot be aborted, drained or dropped. The NVMe copy also carries a
// generation, a table-wide counter stamped at begin_fill, so a completion that arrives for an
// extent that was meanwhile dropped and refilled is recognised as stale.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvtier/types.hpp"

namespace kvtier {

enum class CopyState : uint8_t { kAbsent = 0, kFilling = 1, kReady = 2, kDraining = 3 };

constexpr std::string_view copy_state_name(CopyState s) {
  switch (s) {
    case CopyState::kAbsent: return "absent";
    case CopyState::kFilling: return "filling";
    case CopyState::kReady: return "ready";
    case CopyState::kDraining: return "draining";
  }
  return "unknown";
}

// Names one copy of a block: a page (`tier` hbm or host, `layer` < layers) or the block's NVMe
// extent (`tier` nvme, `layer` kWholeBlock). For NVMe, `generation` other than kAnyGeneration makes
// the transition fail unless it matches the copy's current generation.
struct CopyId {
  static constexpr uint32_t kWholeBlock = 0xFFFF'FFFFu;
  static constexpr uint64_t kAnyGeneration = 0;

  Tier tier = Tier::kHbm;
  uint32_t layer = 0;
  uint64_t generation = kAnyGeneration;

  static constexpr CopyId hbm(uint32_t layer) { return CopyId{Tier::kHbm, layer, kAnyGeneration}; }
  static constexpr CopyId host(uint32_t layer) {
    return CopyId{Tier::kHost, layer, kAnyGeneration};
  }
  static constexpr CopyId page(Tier tier, uint32_t layer) {
    return CopyId{tier, layer, kAnyGeneration};
  }
  static constexpr CopyId nvme(uint64_t generation = kAnyGeneration) {
    return CopyId{Tier::kNvme, kWholeBlock, generation};
  }

  friend constexpr bool operator==(const CopyId&, const CopyId&) = default;
};

}  // namespace kvtier
