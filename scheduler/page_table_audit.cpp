// PageTable: checking — a consistent snapshot of every block, and the audit of the table's
// invariants, all shards locked: each block indexed in its own shard, each copy's frame allocated
// and owned by that copy alone, pins only on HBM copies being filled or ready, the page counters
// equal to the pages, children counted in their parents, and each allocator's frames in use equal
// to the copies that own them and the frames held for abandoned fills. See page_table.hpp.
#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/page_table.hpp"

namespace kvtier {

// Every shard, in ascending order (snapshot, audit). The analysis cannot name a dynamic set of
// capabilities, so the functions that use it opt out of it.
class PageTable::AllShardsLock {
 public:
  AllShardsLock(Shard* shards, uint32_t count) KVTIER_NO_THREAD_SAFETY_ANALYSIS : shards_(shards),
                                                                                  count_(count) {
    for (uint32_t i = 0; i < count_; ++i) shards_[i].mu.lock();
  }
  ~AllShardsLock() KVTIER_NO_THREAD_SAFETY_ANALYSIS {
    for (uint32_t i = count_; i-- > 0;) shards_[i].mu.unlock();
  }
  AllShardsLock(const AllShardsLock&) = delete;
  AllShardsLock& operator=(const AllShardsLock&) = delete;

 private:
  Shard* shards_;
  uint32_t count_;
};

// ---------------------------------------------------------------------------------------------
// Checking
// ---------------------------------------------------------------------------------------------

std::map<BlockKey, BlockInfo> PageTable::snapshot() const {
  std::map<BlockKey, BlockInfo> out;
  AllShardsLock lock(shards_.get(), shard_count());
  for (uint32_t i = 0; i < shard_count(); ++i) {
    const Shard& s = shards_[i];
    for (uint32_t slot = 0; slot < s.slab.high_water(); ++slot) {
      const EntryRef e = entry_at(s, slot);
      if (e.header().live()) out.emplace(e.header().key, info_of(e));
    }
  }
  return out;
}

Status PageTable::audit() const {
  // The frames held for abandoned fills, read before the shards are locked (a lock more than
  // every shard's is past what the thread sanitizer tracks). Their holder abandons and releases
  // them on the scheduler's loop, where the audit runs too, so the cut is still consistent.
  std::array<std::vector<uint32_t>, kNumTiers> held;
  {
    MutexLock held_lock(held_mu_);
    held = held_;
  }
  AllShardsLock lock(shards_.get(), shard_count());
  if (allocators_.hbm != nullptr) {
    KVTIER_RETURN_IF_ERROR(allocators_.hbm->audit().with_context("hbm allocator"));
  }
  if (allocators_.host != nullptr) {
    KVTIER_RETURN_IF_ERROR(allocators_.host->audit().with_context("host allocator"));
  }
  if (allocators_.nvme != nullptr) {
    KVTIER_RETURN_IF_ERROR(allocators_.nvme->audit().with_context("nvme allocator"));
  }

  struct Ownership {
    std::vector<bool> owned;
    uint64_t count = 0;
  };
  std::array<Ownership, kNumTiers> own;
  const auto capacity = [&](Tier t) -> uint32_t {
    switch (t) {
      case Tier::kHbm: return allocators_.hbm ? allocators_.hbm->capacity() : 0;
      case Tier::kHost: return allocators_.host ? allocators_.host->capacity() : 0;
      case Tier::kNvme: return allocators_.nvme ? allocators_.nvme->capacity() : 0;
    }
    return 0;
  };
  const auto allocated = [&](Tier t, uint32_t f) -> bool {
    switch (t) {
      case Tier::kHbm: return allocators_.hbm->is_allocated(f);
      case Tier::kHost: return allocators_.host->is_allocated(f);
      case Tier::kNvme: return allocators_.nvme->is_allocated(f);
    }
    return false;
  };
  for (Tier t : kAllTiers) own[tier_index(t)].owned.assign(capacity(t), false);

  // Checks one copy's state/frame pair and claims its frame. `layer`: CopyId::kWholeBlock for
  // the NVMe extent. Messages are built only on failure: tests audit after every event.
  const auto claim = [&](const BlockKey& key, Tier t, uint32_t layer, CopyState st,
                         uint32_t f) -> Status {
    const auto broken = [&](std::string_view why) {
      const std::string where =
          layer == CopyId::kWholeBlock ? "whole-block" : "layer " + std::to_string(layer);
      return internal_error("block " + to_string(key) + " " + where + " " +
                            std::string(tier_name(t)) + " copy (" +
                            std::string(copy_state_name(st)) + ", frame " + std::to_string(f) +
                            "): " + std::string(why));
    };
    if (st == CopyState::kAbsent) {
      if (f != FrameAllocator::kNoFrame) return broken("absent but has a frame");
      return ok_status();
    }
    Ownership& o = own[tier_index(t)];
    if (f >= o.owned.size()) return broken("frame past the tier's capacity");
    if (!allocated(t, f)) return broken("frame is not allocated");
    if (o.owned[f]) return broken("frame is owned by another copy too");
    o.owned[f] = true;
    ++o.count;
    return ok_status();
  };

  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> children;
  uint64_t private_count = 0;
  uint64_t referenced_count = 0;
  for (uint32_t i = 0; i < shard_count(); ++i) {
    const Shard& s = shards_[i];
    uint32_t live = 0;
    for (uint32_t slot = 0; slot < s.slab.high_water(); ++slot) {
      const EntryRef e = entry_at(s, slot);
      const BlockHeader& hd = e.header();
      if (!hd.live()) continue;
      ++live;
      private_count += hd.key.is_private();
      referenced_count += hd.refcount > 0;
      const auto block = [&hd] { return "block " + to_string(hd.key); };  // for messages
      const uint64_t h = hash_key(hd.key);
      if (shard_index(h) != i) return internal_error(block() + " is stored in the wrong shard");
      if (find_slot(s, h, hd.key) != slot) {
        return internal_error(block() + " is not indexed at its slot");
      }
      constexpr uint8_t kKnownFlags = BlockHeader::kLive | BlockHeader::kLinked |
                                      BlockHeader::kHasChecksum | BlockHeader::kHintedIntoHbm |
                                      BlockHeader::kHintedIntoHost;
      if ((hd.flags & ~kKnownFlags) != 0) return internal_error(block() + " has unknown flags");
      uint32_t hbm_copies = 0, host_copies = 0, hbm_ready = 0, mem_ready = 0, pinned = 0;
      for (uint32_t l = 0; l < layers(); ++l) {
        const uint16_t m = e.meta(l);
        const CopyState hs = meta_hbm_state(m);
        const CopyState ms = meta_host_state(m);
        KVTIER_RETURN_IF_ERROR(claim(hd.key, Tier::kHbm, l, hs, e.hbm_frame(l)));
        KVTIER_RETURN_IF_ERROR(claim(hd.key, Tier::kHost, l, ms, e.host_frame(l)));
        const uint32_t p = meta_pins(m);
        if (p > 0 && hs != CopyState::kFilling && hs != CopyState::kReady) {
          return internal_error(block() + " layer " + std::to_string(l) + " has " +
                                std::to_string(p) + " pins on a " +
                                std::string(copy_state_name(hs)) + " hbm copy");
        }
        hbm_copies += hs != CopyState::kAbsent;
        host_copies += ms != CopyState::kAbsent;
        hbm_ready += hs == CopyState::kReady;
        mem_ready += hs == CopyState::kReady || ms == CopyState::kReady;
        pinned += p > 0;
      }
      KVTIER_RETURN_IF_ERROR(claim(hd.key, Tier::kNvme, CopyId::kWholeBlock,
                                   static_cast<CopyState>(hd.nvme_state), hd.nvme_extent));
      if (hbm_copies != hd.hbm_copies || host_copies != hd.host_copies ||
          hbm_ready != hd.hbm_ready || mem_ready != hd.mem_ready || pinned != hd.pinned_pages) {
        return internal_error(
            block() + " page counters disagree with its pages (hbm copies " +
            std::to_string(hd.hbm_copies) + "/" + std::to_string(hbm_copies) + ", host copies " +
            std::to_string(hd.host_copies) + "/" + std::to_string(host_copies) + ", hbm ready " +
            std::to_string(hd.hbm_ready) + "/" + std::to_string(hbm_ready) + ", memory ready " +
            std::to_string(hd.mem_ready) + "/" + std::to_string(mem_ready) + ", pinned " +
            std::to_string(hd.pinned_pages) + "/" + std::to_string(pinned) + ")");
      }
      if (((hd.flags & BlockHeader::kHintedIntoHbm) != 0 && hd.hbm_copies == 0) ||
          ((hd.flags & BlockHeader::kHintedIntoHost) != 0 && hd.hbm_copies + hd.host_copies == 0)) {
        return internal_error(block() + " is marked as brought in by a hint with no copy to show");
      }
      if (hd.block_pins != 0 && hd.hbm_ready != layers()) {
        return internal_error(block() + " has " + std::to_string(hd.block_pins) +
                              " block pins but only " + std::to_string(hd.hbm_ready) + " of " +
                              std::to_string(layers()) + " pages ready in HBM");
      }
      if ((hd.flags & BlockHeader::kLinked) != 0) {
        const uint64_t ph = hash_key(hd.parent);
        if (find_slot(shard_for(ph), ph, hd.parent) == FlatKeyMap::kNotFound) {
          return internal_error(block() + " is counted as a child of " + to_string(hd.parent) +
                                ", which is not in the table");
        }
        ++children[hd.parent];
      }
    }
    if (live != s.slab.live() || live != s.map.size()) {
      return internal_error("shard " + std::to_string(i) + " holds " + std::to_string(live) +
                            " live entries but its slab counts " + std::to_string(s.slab.live()) +
                            " and its index " + std::to_string(s.map.size()));
    }
    Status index_status;
    index_status.ignore();
    const EntrySlab* slab = &s.slab;
    s.map.for_each([&](uint32_t, uint32_t slot) {
      if (!index_status.ok()) return;
      if (slot >= slab->high_water() || !EntryRef(slab->at(slot), layout_).header().live()) {
        index_status = internal_error("shard " + std::to_string(i) + " indexes slot " +
                                      std::to_string(slot) + ", which holds no block");
      }
    });
    KVTIER_RETURN_IF_ERROR(std::move(index_status));
  }

  if (private_count != private_blocks()) {
    return internal_error("the table counts " + std::to_string(private_blocks()) +
                          " private blocks but holds " + std::to_string(private_count));
  }
  if (referenced_count != referenced_blocks()) {
    return internal_error("the table counts " + std::to_string(referenced_blocks()) +
                          " blocks with references but holds " + std::to_string(referenced_count));
  }

  // cached_children of every block equals the number of its linked children.
  for (uint32_t i = 0; i < shard_count(); ++i) {
    const Shard& s = shards_[i];
    for (uint32_t slot = 0; slot < s.slab.high_water(); ++slot) {
      const BlockHeader& hd = entry_at(s, slot).header();
      if (!hd.live()) continue;
      const auto it = children.find(hd.key);
      const uint32_t expected = it == children.end() ? 0 : it->second;
      if (hd.cached_children != expected) {
        return internal_error("block " + to_string(hd.key) + " counts " +
                              std::to_string(hd.cached_children) + " cached children but " +
                              std::to_string(expected) + " are in the table");
      }
    }
  }

  // Frames held for abandoned fills belong to no copy, and count as owned.
  for (Tier t : kAllTiers) {
    Ownership& o = own[tier_index(t)];
    for (uint32_t f : held[tier_index(t)]) {
      const std::string what =
          std::string(tier_name(t)) + " frame " + std::to_string(f) + " held for an abandoned fill";
      if (f >= o.owned.size()) return internal_error(what + " is past the tier's capacity");
      if (!allocated(t, f)) return internal_error(what + " is not allocated");
      if (o.owned[f]) return internal_error(what + " is owned by a copy too");
      o.owned[f] = true;
      ++o.count;
    }
  }

  // Exact accounting: every allocated frame belongs to exactly one copy (or is held).
  for (Tier t : kAllTiers) {
    const uint64_t used = [&]() -> uint64_t {
      switch (t) {
        case Tier::kHbm: return allocators_.hbm ? allocators_.hbm->used() : 0;
        case Tier::kHost: return allocators_.host ? allocators_.host->used() : 0;
        case Tier::kNvme: return allocators_.nvme ? allocators_.nvme->used() : 0;
      }
      return 0;
    }();
    if (used != own[tier_index(t)].count) {
      return internal_error(std::string(tier_name(t)) + " allocator has " + std::to_string(used) +
                            " frames in use but the table's copies own " +
                            std::to_string(own[tier_index(t)].count));
    }
  }
  return ok_status();
}

}  // namespace kvtier
