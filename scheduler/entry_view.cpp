#include "scheduler/entry_view.hpp"

#include <limits>
#include <string>

namespace kvtier {
namespace {

std::string state_str(CopyState s) { return std::string(copy_state_name(s)); }

bool is_page_tier(Tier t) { return t == Tier::kHbm || t == Tier::kHost; }

}  // namespace

Status free_tier_frame(const TierAllocators& allocators, Tier tier, uint32_t frame) {
  Status s = [&]() -> Status {
    switch (tier) {
      case Tier::kHbm: return allocators.hbm->free(frame);
      case Tier::kHost: return allocators.host->free(frame);
      case Tier::kNvme: return allocators.nvme->free(frame);
    }
    return invalid_argument("tier " + std::to_string(static_cast<int>(tier)) + " does not exist");
  }();
  if (s.ok()) return s;
  return internal_error("page table returned " + std::string(tier_name(tier)) + " frame " +
                        std::to_string(frame) +
                        " that its allocator does not hold: " + s.to_string());
}

// ---- Reads ----

CopyState EntryView::state(const CopyId& copy) const {
  if (copy.tier == Tier::kNvme) {
    return copy.layer == CopyId::kWholeBlock ? static_cast<CopyState>(entry_.header().nvme_state)
                                             : CopyState::kAbsent;
  }
  if (!is_page_tier(copy.tier) || copy.layer >= layers()) return CopyState::kAbsent;
  const uint16_t m = entry_.meta(copy.layer);
  return copy.tier == Tier::kHbm ? meta_hbm_state(m) : meta_host_state(m);
}

uint32_t EntryView::frame(const CopyId& copy) const {
  if (copy.tier == Tier::kNvme) {
    return copy.layer == CopyId::kWholeBlock ? entry_.header().nvme_extent
                                             : FrameAllocator::kNoFrame;
  }
  if (!is_page_tier(copy.tier) || copy.layer >= layers()) return FrameAllocator::kNoFrame;
  return copy.tier == Tier::kHbm ? entry_.hbm_frame(copy.layer) : entry_.host_frame(copy.layer);
}

uint32_t EntryView::pins(uint32_t layer) const {
  return layer < layers() ? meta_pins(entry_.meta(layer)) + entry_.header().block_pins : 0;
}

std::optional<uint64_t> EntryView::checksum() const {
  const BlockHeader& h = entry_.header();
  if ((h.flags & BlockHeader::kHasChecksum) == 0) return std::nullopt;
  return h.checksum;
}

AccessStats EntryView::stats() const {
  const BlockHeader& h = entry_.header();
  return AccessStats{h.last_access, h.inserted, h.hits};
}

uint32_t EntryView::copies(Tier tier) const {
  const BlockHeader& h = entry_.header();
  switch (tier) {
    case Tier::kHbm: return h.hbm_copies;
    case Tier::kHost: return h.host_copies;
    case Tier::kNvme:
      return static_cast<CopyState>(h.nvme_state) == CopyState::kAbsent ? 0 : layers();
  }
  return 0;
}

bool EntryView::shadowed(Tier tier) const {
  const BlockHeader& h = entry_.header();
  switch (tier) {
    case Tier::kHbm: return false;
    case Tier::kHost: return h.hbm_ready == layers();
    case Tier::kNvme: return h.mem_ready == layers();
  }
  return false;
}

std::optional<Tier> EntryView::match_tier() const {
  const BlockHeader& h = entry_.header();
  if (h.hbm_ready == layers()) return Tier::kHbm;
  if (h.mem_ready == layers()) return Tier::kHost;
  if (static_cast<CopyState>(h.nvme_state) == CopyState::kReady) return Tier::kNvme;
  return std::nullopt;
}

bool EntryView::dirty() const {
  if (static_cast<CopyState>(entry_.header().nvme_state) == CopyState::kReady) return false;
  const auto valid = [](CopyState s) {
    return s == CopyState::kReady || s == CopyState::kDraining;
  };
  for (uint32_t l = 0; l < layers(); ++l) {
    const uint16_t m = entry_.meta(l);
    if (valid(meta_hbm_state(m)) || valid(meta_host_state(m))) return true;
  }
  return false;
}

// ---- Checks ----

std::string EntryView::describe(const CopyId& copy) const {
  std::string out = "the ";
  out += tier_name(copy.tier);
  out += " copy of block ";
  out += to_string(key());
  if (copy.tier != Tier::kNvme) {
    out += " layer ";
    out += std::to_string(copy.layer);
  }
  return out;
}

Status EntryView::check_copy(const CopyId& copy, const char* op) const {
  if (copy.tier == Tier::kNvme) {
    if (copy.layer != CopyId::kWholeBlock) {
      return invalid_argument(std::string(op) + " of block " + to_string(key()) +
                              ": the nvme copy is per block, but layer " +
                              std::to_string(copy.layer) + " was given (use CopyId::nvme())");
    }
    return ok_status();
  }
  if (!is_page_tier(copy.tier)) {
    return invalid_argument(std::string(op) + " of block " + to_string(key()) + ": tier " +
                            std::to_string(static_cast<int>(copy.tier)) + " does not exist");
  }
  if (copy.layer >= layers()) {
    return invalid_argument(std::string(op) + " of block " + to_string(key()) + " tier " +
                            std::string(tier_name(copy.tier)) + ": layer " +
                            std::to_string(copy.layer) + " is past the block's " +
                            std::to_string(layers()) + " layers");
  }
  if (copy.generation != CopyId::kAnyGeneration) {
    return invalid_argument(std::string(op) + " of " + describe(copy) +
                            ": generations apply to nvme copies only");
  }
  return ok_status();
}

Status EntryView::expect_state(const CopyId& copy, const char* op, CopyState expected) const {
  KVTIER_RETURN_IF_ERROR(check_copy(copy, op));
  const CopyState now = state(copy);
  if (now != expected) {
    return failed_precondition("cannot " + std::string(op) + " " + describe(copy) + ": it is " +
                               state_str(now) + ", not " + state_str(expected));
  }
  if (copy.tier == Tier::kNvme && copy.generation != CopyId::kAnyGeneration &&
      copy.generation != nvme_generation()) {
    return failed_precondition("cannot " + std::string(op) + " " + describe(copy) +
                               ": stale generation " + std::to_string(copy.generation) +
                               " (the extent now holds generation " +
                               std::to_string(nvme_generation()) + ")");
  }
  return ok_status();
}

Status EntryView::check_unpinned(const CopyId& copy, const char* op) const {
  if (copy.tier != Tier::kHbm) return ok_status();
  const uint32_t p = pins(copy.layer);
  if (p == 0) return ok_status();
  return failed_precondition("cannot " + std::string(op) + " " + describe(copy) +
                             ": it is pinned (" + std::to_string(p) + " pins)");
}

// ---- Mutation helpers ----

void EntryView::set_state(const CopyId& copy, CopyState next, uint32_t frame) {
  BlockHeader& h = entry_.header();
  if (copy.tier == Tier::kNvme) {
    h.nvme_state = static_cast<uint8_t>(next);
    h.nvme_extent = frame;
    return;
  }
  const uint32_t l = copy.layer;
  const uint16_t m = entry_.meta(l);
  const CopyState hbm_before = meta_hbm_state(m);
  const CopyState host_before = meta_host_state(m);
  const CopyState hbm_after = copy.tier == Tier::kHbm ? next : hbm_before;
  const CopyState host_after = copy.tier == Tier::kHost ? next : host_before;
  const auto delta = [](bool before, bool after) { return static_cast<int>(after) - before; };
  h.hbm_copies = static_cast<uint16_t>(
      h.hbm_copies + delta(hbm_before != CopyState::kAbsent, hbm_after != CopyState::kAbsent));
  h.host_copies = static_cast<uint16_t>(
      h.host_copies + delta(host_before != CopyState::kAbsent, host_after != CopyState::kAbsent));
  h.hbm_ready = static_cast<uint16_t>(
      h.hbm_ready + delta(hbm_before == CopyState::kReady, hbm_after == CopyState::kReady));
  h.mem_ready = static_cast<uint16_t>(
      h.mem_ready + delta(hbm_before == CopyState::kReady || host_before == CopyState::kReady,
                          hbm_after == CopyState::kReady || host_after == CopyState::kReady));
  entry_.set_meta(l, make_meta(hbm_after, host_after, meta_pins(m)));
  // A hint's mark goes with the copies it marks: a copy loaded again later is not the hint's.
  if (h.hbm_copies == 0) {
    h.flags &= static_cast<uint8_t>(~BlockHeader::kHintedIntoHbm);
    if (h.host_copies == 0) h.flags &= static_cast<uint8_t>(~BlockHeader::kHintedIntoHost);
  }
  if (copy.tier == Tier::kHbm) {
    entry_.set_hbm_frame(l, frame);
  } else {
    entry_.set_host_frame(l, frame);
  }
}

Result<uint32_t> EntryView::allocate_frame(const CopyId& copy) {
  const Tier tier = copy.tier;
  Result<uint32_t> r = [&]() -> Result<uint32_t> {
    switch (tier) {
      case Tier::kHbm:
        if (allocators_.hbm != nullptr) return allocators_.hbm->allocate();
        break;
      case Tier::kHost:
        if (allocators_.host != nullptr) return allocators_.host->allocate();
        break;
      case Tier::kNvme:
        if (allocators_.nvme != nullptr) return allocators_.nvme->allocate();
        break;
    }
    return unavailable("the " + std::string(tier_name(tier)) + " tier is not configured");
  }();
  if (!r.ok()) {
    const std::string what = "cannot begin_fill " + describe(copy) + ": ";
    if (r.status().code() == StatusCode::kUnavailable) {
      return Status(StatusCode::kUnavailable, what + r.status().message());
    }
    return Status(r.status().code(), what + "no free " + std::string(tier_name(tier)) + " frame (" +
                                         r.status().message() + ")");
  }
  if (undo_ != nullptr) undo_->allocations.push_back(TierFrame{tier, *r});
  return r;
}

Status EntryView::release_frame(Tier tier, uint32_t frame) {
  if (undo_ != nullptr) {
    undo_->frees.push_back(TierFrame{tier, frame});
    return ok_status();
  }
  return free_tier_frame(allocators_, tier, frame);
}

// ---- Transitions ----

Result<uint32_t> EntryView::begin_fill(const CopyId& copy) {
  if (copy.tier == Tier::kNvme && copy.generation != CopyId::kAnyGeneration) {
    return invalid_argument("begin_fill of the nvme copy of block " + to_string(key()) +
                            ": begin_fill assigns the generation, pass CopyId::nvme()");
  }
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "begin_fill", CopyState::kAbsent));
  KVTIER_ASSIGN_OR_RETURN(const uint32_t frame, allocate_frame(copy));
  if (copy.tier == Tier::kNvme) {
    entry_.header().nvme_generation =
        nvme_generations_->fetch_add(1, std::memory_order_relaxed) + 1;
  }
  set_state(copy, CopyState::kFilling, frame);
  return frame;
}

Status EntryView::complete_fill(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "complete_fill", CopyState::kFilling));
  set_state(copy, CopyState::kReady, frame(copy));
  return ok_status();
}

Status EntryView::abort_fill(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "abort_fill", CopyState::kFilling));
  KVTIER_RETURN_IF_ERROR(check_unpinned(copy, "abort_fill"));
  KVTIER_RETURN_IF_ERROR(release_frame(copy.tier, frame(copy)));
  set_state(copy, CopyState::kAbsent, FrameAllocator::kNoFrame);
  return ok_status();
}

Result<uint32_t> EntryView::abandon_fill(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "abandon_fill", CopyState::kFilling));
  KVTIER_RETURN_IF_ERROR(check_unpinned(copy, "abandon_fill"));
  const uint32_t kept = frame(copy);
  set_state(copy, CopyState::kAbsent, FrameAllocator::kNoFrame);
  return kept;
}

Status EntryView::begin_drain(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "begin_drain", CopyState::kReady));
  KVTIER_RETURN_IF_ERROR(check_unpinned(copy, "begin_drain"));
  set_state(copy, CopyState::kDraining, frame(copy));
  return ok_status();
}

Status EntryView::complete_drain(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "complete_drain", CopyState::kDraining));
  KVTIER_RETURN_IF_ERROR(check_unpinned(copy, "complete_drain"));
  KVTIER_RETURN_IF_ERROR(release_frame(copy.tier, frame(copy)));
  set_state(copy, CopyState::kAbsent, FrameAllocator::kNoFrame);
  return ok_status();
}

Status EntryView::cancel_drain(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "cancel_drain", CopyState::kDraining));
  set_state(copy, CopyState::kReady, frame(copy));
  return ok_status();
}

Status EntryView::drop(const CopyId& copy) {
  KVTIER_RETURN_IF_ERROR(expect_state(copy, "drop", CopyState::kReady));
  KVTIER_RETURN_IF_ERROR(check_unpinned(copy, "drop"));
  KVTIER_RETURN_IF_ERROR(release_frame(copy.tier, frame(copy)));
  set_state(copy, CopyState::kAbsent, FrameAllocator::kNoFrame);
  return ok_status();
}

Result<uint32_t> EntryView::pin(uint32_t layer) {
  const CopyId copy = CopyId::hbm(layer);
  KVTIER_RETURN_IF_ERROR(check_copy(copy, "pin"));
  const uint16_t m = entry_.meta(layer);
  const CopyState s = meta_hbm_state(m);
  if (s != CopyState::kFilling && s != CopyState::kReady) {
    return failed_precondition("cannot pin " + describe(copy) + ": it is " + state_str(s) +
                               " (only a filling or ready HBM copy can be pinned)");
  }
  const uint32_t p = meta_pins(m);
  if (p == kMaxPins) {
    return resource_exhausted("cannot pin " + describe(copy) + ": it already has the maximum of " +
                              std::to_string(kMaxPins) + " pins");
  }
  entry_.set_meta(layer, make_meta(s, meta_host_state(m), p + 1));
  if (p == 0) ++entry_.header().pinned_pages;
  return entry_.hbm_frame(layer);
}

bool EntryView::pin_range(uint32_t first, uint32_t count, bool ready_only, uint32_t* frames,
                          std::size_t stride) {
  for (uint32_t l = first; l < first + count; ++l) {
    const uint16_t m = entry_.meta(l);
    const CopyState s = meta_hbm_state(m);
    const bool pinnable = s == CopyState::kReady || (!ready_only && s == CopyState::kFilling);
    if (!pinnable || meta_pins(m) == kMaxPins) return false;
  }
  for (uint32_t c = 0; c < count; ++c) {
    const uint32_t l = first + c;
    const uint16_t m = entry_.meta(l);
    const uint32_t p = meta_pins(m);
    entry_.set_meta(l, make_meta(meta_hbm_state(m), meta_host_state(m), p + 1));
    if (p == 0) ++entry_.header().pinned_pages;
    frames[c * stride] = entry_.hbm_frame(l);
  }
  return true;
}

uint32_t EntryView::unpin_range(uint32_t first, uint32_t count) {
  uint32_t not_pinned = first + count;
  for (uint32_t l = first; l < first + count; ++l) {
    const uint16_t m = entry_.meta(l);
    const uint32_t p = meta_pins(m);
    if (p == 0) {
      if (not_pinned == first + count) not_pinned = l;
      continue;
    }
    entry_.set_meta(l, make_meta(meta_hbm_state(m), meta_host_state(m), p - 1));
    if (p == 1) --entry_.header().pinned_pages;
  }
  return not_pinned;
}

bool EntryView::pin_block(uint32_t* frames) {
  BlockHeader& h = entry_.header();
  if (h.hbm_ready != layers() || h.block_pins == kMaxBlockPins) return false;
  ++h.block_pins;
  for (uint32_t l = 0; l < layers(); ++l) frames[l] = entry_.hbm_frame(l);
  return true;
}

bool EntryView::unpin_block() {
  BlockHeader& h = entry_.header();
  if (h.block_pins == 0) return false;
  --h.block_pins;
  return true;
}

bool EntryView::split_block_pin(uint32_t first, uint32_t count) {
  if (entry_.header().block_pins == 0) return false;
  for (uint32_t l = first; l < first + count; ++l) {
    if (meta_pins(entry_.meta(l)) == kMaxPins) return false;
  }
  for (uint32_t l = first; l < first + count; ++l) {
    const uint16_t m = entry_.meta(l);
    const uint32_t p = meta_pins(m);
    entry_.set_meta(l, make_meta(meta_hbm_state(m), meta_host_state(m), p + 1));
    if (p == 0) ++entry_.header().pinned_pages;
  }
  --entry_.header().block_pins;
  return true;
}

Status EntryView::unpin(uint32_t layer) {
  const CopyId copy = CopyId::hbm(layer);
  KVTIER_RETURN_IF_ERROR(check_copy(copy, "unpin"));
  const uint16_t m = entry_.meta(layer);
  const uint32_t p = meta_pins(m);
  if (p == 0) {
    return failed_precondition("cannot unpin " + describe(copy) + ": it is not pinned (state " +
                               state_str(meta_hbm_state(m)) + ", unpin below zero)");
  }
  entry_.set_meta(layer, make_meta(meta_hbm_state(m), meta_host_state(m), p - 1));
  if (p == 1) --entry_.header().pinned_pages;
  return ok_status();
}

Result<uint32_t> EntryView::drop_all(Tier tier) {
  if (tier == Tier::kNvme) {
    if (state(CopyId::nvme()) != CopyState::kReady) return 0u;
    KVTIER_RETURN_IF_ERROR(drop(CopyId::nvme()));
    return 1u;
  }
  if (!is_page_tier(tier)) {
    return invalid_argument("drop_all of block " + to_string(key()) + ": tier " +
                            std::to_string(static_cast<int>(tier)) + " does not exist");
  }
  uint32_t dropped = 0;
  for (uint32_t l = 0; l < layers(); ++l) {
    const CopyId copy = CopyId::page(tier, l);
    if (state(copy) != CopyState::kReady || (tier == Tier::kHbm && pins(l) != 0)) continue;
    KVTIER_RETURN_IF_ERROR(drop(copy));
    ++dropped;
  }
  return dropped;
}

Status EntryView::acquire() {
  BlockHeader& h = entry_.header();
  if (h.refcount == std::numeric_limits<uint32_t>::max()) {
    return resource_exhausted("cannot acquire block " + to_string(key()) +
                              ": its reference count is at the maximum");
  }
  ++h.refcount;
  return ok_status();
}

Result<uint32_t> EntryView::release() {
  BlockHeader& h = entry_.header();
  if (h.refcount == 0) {
    return failed_precondition("cannot release block " + to_string(key()) +
                               ": it has no references (release below zero)");
  }
  return --h.refcount;
}

void EntryView::set_checksum(uint64_t checksum) {
  BlockHeader& h = entry_.header();
  h.checksum = checksum;
  h.flags |= BlockHeader::kHasChecksum;
}

void EntryView::clear_checksum() {
  BlockHeader& h = entry_.header();
  h.checksum = 0;
  h.flags &= static_cast<uint8_t>(~BlockHeader::kHasChecksum);
}

void EntryView::touch() {
  entry_.header().last_access = clock_->fetch_add(1, std::memory_order_relaxed) + 1;
}

HintedCopies EntryView::hinted() const {
  const uint8_t f = entry_.header().flags;
  return HintedCopies{.hbm = (f & BlockHeader::kHintedIntoHbm) != 0,
                      .host = (f & BlockHeader::kHintedIntoHost) != 0};
}

bool EntryView::mark_hinted(Tier tier) {
  BlockHeader& h = entry_.header();
  uint8_t flag = 0;
  switch (tier) {
    case Tier::kHbm: flag = h.hbm_copies > 0 ? BlockHeader::kHintedIntoHbm : 0; break;
    case Tier::kHost: flag = h.host_copies > 0 ? BlockHeader::kHintedIntoHost : 0; break;
    case Tier::kNvme: break;
  }
  if (flag == 0 || (h.flags & flag) != 0 || h.refcount > 0) return false;
  h.flags |= flag;
  return true;
}

HintedCopies EntryView::take_hinted() {
  const HintedCopies marks = hinted();
  entry_.header().flags &=
      static_cast<uint8_t>(~(BlockHeader::kHintedIntoHbm | BlockHeader::kHintedIntoHost));
  return marks;
}

}  // namespace kvtier
