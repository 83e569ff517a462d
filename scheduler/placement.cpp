#include "scheduler/placement.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kvtier {

struct Placement::Budget {
  std::array<uint64_t, kNumTiers> free{};
  // Keys already leaving, and keys arriving, per tier in this plan: neither may be chosen again.
  std::array<std::unordered_set<BlockKey, BlockKeyHash>, kNumTiers> leaving;
  std::array<std::unordered_set<BlockKey, BlockKeyHash>, kNumTiers> arriving;
  // Keys dropped from some tier in this plan, and whether as shadowed. A shadowed drop relies on
  // the copy above, so a block shadowed-dropped in one tier is dropped from no other in the same
  // plan, nor is a block dropped elsewhere shadowed-dropped (moving it down stays allowed).
  std::unordered_map<BlockKey, bool, BlockKeyHash> dropped;
  // Keys whose host pages a move of this plan takes out of host memory (dropped, or written to
  // NVMe and dropped): HBM pages of theirs have no host copy to fall back on any more.
  std::unordered_set<BlockKey, BlockKeyHash> host_pages_leave;
  // Each tier's victims in its evictor's order, fetched in growing batches. The evictors do not
  // change while a plan is made, so a tier asked for room again (once per block demoted into it)
  // continues where it stopped. Rejected: asking the evictor afresh each time, which walks its
  // list from the cold end past every block already leaving: quadratic in the plan's size, and
  // most of the scheduler's time when links are saturated.
  struct Candidates {
    std::vector<BlockKey> keys;
    std::size_t next = 0;         // first key of `keys` not yet considered
    std::size_t asked = 0;        // size of the last batch asked for
    bool exhausted = false;       // the evictor had no more candidates
    bool referenced_too = false;  // past the blocks no open sequence reads from here (free_in)
  };
  std::array<Candidates, kNumTiers> candidates;
};

namespace {

// What the placement reads about one block, under its shard lock.
struct Snapshot {
  bool found = false;
  BlockKey parent;
  uint32_t hits = 0;
  uint32_t layers = 0;
  uint32_t evictable = 0;     // ready (and, in HBM, unpinned) copies in the tier
  uint32_t pinned = 0;        // pinned HBM pages
  bool in_flight = false;     // a copy in the tier is filling or draining
  uint32_t host_missing = 0;  // evictable pages without a host copy (HBM only)
  uint32_t hbm_missing = 0;   // evictable pages without a ready HBM copy (host only)
  bool nvme_ready = false;
  bool nvme_absent = true;
  bool all_in_memory = false;   // every page ready in HBM or host (an NVMe copy can be written)
  bool shadowed = false;        // every page ready in a faster tier (EntryView::shadowed)
  bool kept_in_memory = false;  // see kvtier::kept_in_memory
  bool referenced = false;      // an open sequence holds it
};

Snapshot read_block(const PageTable& table, const BlockKey& key, Tier tier, bool nvme_tier) {
  Snapshot s;
  Status st = table.visit(key, [&](const EntryView& v) {
    s.found = true;
    s.referenced = v.refcount() > 0;
    s.kept_in_memory = kept_in_memory(key, s.referenced, nvme_tier);
    s.parent = v.parent();
    s.hits = v.stats().hits;
    s.layers = v.layers();
    s.pinned = v.pinned_pages();
    const CopyState nvme = v.state(CopyId::nvme());
    s.nvme_ready = nvme == CopyState::kReady;
    s.nvme_absent = nvme == CopyState::kAbsent;
    s.all_in_memory = v.memory_ready_pages() == v.layers();
    s.shadowed = v.shadowed(tier);
    if (tier == Tier::kNvme) {
      s.evictable = s.nvme_ready ? 1 : 0;
      s.in_flight = nvme == CopyState::kFilling || nvme == CopyState::kDraining;
      return;
    }
    for (uint32_t l = 0; l < v.layers(); ++l) {
      const CopyState c = v.state(CopyId::page(tier, l));
      if (c == CopyState::kFilling || c == CopyState::kDraining) s.in_flight = true;
      if (c != CopyState::kReady) continue;
      if (tier == Tier::kHbm && v.pins(l) != 0) continue;
      // A block kept in memory must not be lost: a host page of it leaves only when its HBM copy
      // is ready.
      if (tier == Tier::kHost && s.kept_in_memory && v.state(CopyId::hbm(l)) != CopyState::kReady) {
        continue;
      }
      ++s.evictable;
      if (tier == Tier::kHbm && v.state(CopyId::host(l)) == CopyState::kAbsent) ++s.host_missing;
      if (tier == Tier::kHost && v.state(CopyId::hbm(l)) != CopyState::kReady) ++s.hbm_missing;
    }
  });
  if (!st.ok()) s.found = false;
  return s;
}

// A block an open sequence holds, read from `tier` by its next step: one no faster tier holds in
// full (in HBM, every such block).
bool read_next_from(const PageTable& table, const BlockKey& key, Tier tier) {
  bool wanted = false;
  table.visit(key, [&](const EntryView& v) { wanted = v.refcount() > 0 && !v.shadowed(tier); })
      .ignore();
  return wanted;
}

}  // namespace

Placement::Placement(const PageTable& table, std::array<Evictor*, kNumTiers> evictors,
                     const NvmeAdmission& admission, const WriteStrategy& write)
    : table_(table), evictors_(evictors), admission_(admission), write_(write) {}

std::optional<Tier> Placement::next_tier(Tier tier) const {
  for (int i = tier_index(tier) + 1; i < kNumTiers; ++i) {
    if (static_cast<Tier>(i) == Tier::kNvme && !nvme_writable_) continue;
    if (evictors_[static_cast<std::size_t>(i)] != nullptr) return static_cast<Tier>(i);
  }
  return std::nullopt;
}

uint64_t Placement::watermark_deficit(uint64_t capacity, uint64_t used, const Watermarks& marks) {
  const double high = marks.high * static_cast<double>(capacity);
  if (static_cast<double>(used) <= high) return 0;
  const auto low = static_cast<uint64_t>(marks.low * static_cast<double>(capacity));
  return used > low ? used - low : 0;
}

bool Placement::admit_new(const BlockFacts& block,
                          std::array<uint64_t, kNumTiers> free_frames) const {
  Tier decides = Tier::kHbm;
  for (std::optional<Tier> t = next_tier(Tier::kHbm); t; t = next_tier(*t)) {
    if (free_frames[static_cast<std::size_t>(tier_index(*t))] > 0) return true;
    decides = *t;
  }
  Evictor* ev = evictors_[static_cast<std::size_t>(tier_index(decides))];
  return ev != nullptr && ev->admit(block);
}

PlacementPlan Placement::plan_room(Tier tier, uint64_t frames,
                                   std::array<uint64_t, kNumTiers> free_frames,
                                   const TierFilters& skip) {
  PlacementPlan plan;
  ++counters_.plans;
  const std::size_t t = static_cast<std::size_t>(tier_index(tier));
  if (free_frames[t] >= frames) return plan;
  Budget budget;
  budget.free = free_frames;
  plan.shortfall = free_in(tier, frames - free_frames[t], budget, skip, plan, 0);
  for (const PlannedMove& m : plan.moves) {
    plan.freed[static_cast<std::size_t>(tier_index(m.from))] += m.frames_freed;
    if (m.to) plan.taken[static_cast<std::size_t>(tier_index(*m.to))] += m.frames_taken;
  }
  return plan;
}

uint64_t Placement::free_in(Tier tier, uint64_t frames, Budget& budget, const TierFilters& skip,
                            PlacementPlan& plan, int depth) {
  const std::size_t ti = static_cast<std::size_t>(tier_index(tier));
  Evictor* ev = evictors_[ti];
  if (ev == nullptr || depth >= kNumTiers) return frames;
  uint64_t freed = 0;
  const auto taken = [&](const BlockKey& k) {
    return budget.leaving[ti].count(k) != 0 || budget.arriving[ti].count(k) != 0;
  };
  const bool nvme_tier =
      nvme_writable_ && evictors_[static_cast<std::size_t>(tier_index(Tier::kNvme))] != nullptr;
  Budget::Candidates& c = budget.candidates[ti];
  const auto refuse = [&](const BlockKey& k) {
    return skip[ti](k) || taken(k) || (!c.referenced_too && read_next_from(table_, k, tier));
  };
  while (freed < frames) {
    if (c.next == c.keys.size()) {
      if (c.exhausted && !c.referenced_too) {
        // Every block no open sequence reads from this tier is leaving or refused: now those it
        // does, in the evictor's order, from its cold end again.
        c.referenced_too = true;
        c.exhausted = false;
        c.asked = 0;
      }
      if (c.exhausted) break;
      // Twice the last batch: the walks past keys already leaving add up to a constant factor.
      const std::size_t want = std::max<std::size_t>(frames - freed, 2 * c.asked);
      c.keys.clear();
      c.next = 0;
      c.asked = want;
      c.exhausted = ev->select_victims(want, KeyFilter(refuse), c.keys) < want;
      if (c.keys.empty()) {
        if (c.referenced_too) break;
        continue;  // none but referenced blocks: walk again with them
      }
    }
    const BlockKey key = c.keys[c.next++];
    if (taken(key)) continue;        // chosen or arriving since the batch was fetched
    budget.leaving[ti].insert(key);  // never proposed twice in one plan
    Snapshot s = read_block(table_, key, tier, nvme_tier && !nvme_refuses_(key));
    if (tier == Tier::kHbm && budget.host_pages_leave.count(key) != 0) {
      s.host_missing = s.evictable;  // its host copies leave in this plan: each page needs a frame
    }
    // Memory tiers give up pages one by one: a block whose other pages are pinned (a step's
    // window) or in flight still frees its ready, unpinned ones. The NVMe copy is one extent.
    // A block in use whose NVMe copy is the last of some page stays (the executor would refuse
    // the drop): counted as freed, it let host memory plan room it never got, and HBM demoted into
    // it, round after round at one instant (NVMe smaller than the blocks in use).
    if (!s.found || s.evictable == 0 || (tier == Tier::kNvme && s.in_flight) ||
        (tier == Tier::kNvme && s.referenced && !s.all_in_memory)) {
      ++counters_.skipped;
      continue;
    }
    PlannedMove move;
    move.block.key = key;
    move.block.parent = s.parent;
    move.block.hits = s.hits;
    ev->describe(key, move.block);
    move.block.demoted = true;
    move.from = tier;
    move.frames_freed = s.evictable;

    bool clean = false;
    switch (tier) {
      case Tier::kHbm: clean = s.host_missing == 0 || s.nvme_ready; break;
      case Tier::kHost: clean = s.nvme_ready; break;
      case Tier::kNvme: clean = false; break;
    }
    const std::optional<Tier> next = next_tier(tier);
    bool refused = false;  // a demotion the tier below refused: dropped instead
    if (s.shadowed && !write_.keeps_shadowed_copies()) {
      move.shadowed = true;  // a left-over copy: a faster tier holds every page
    } else if (clean || !write_.demote_on_evict() || !next) {
      move.clean_below = clean;
    } else {
      const std::size_t ni = static_cast<std::size_t>(tier_index(*next));
      bool admitted = true;
      bool ask_evictor = true;  // the last tier's bypass, asked only when that tier is full
      uint64_t need = 0;
      if (*next == Tier::kNvme) {
        // The NVMe store is addressed by content key: a private block has none yet.
        admitted = s.nvme_absent && s.all_in_memory && !key.is_private() &&
                   admission_.admits(s.hits) && !nvme_refuses_(key);
        need = 1;
      } else {  // host, from HBM
        ask_evictor = !evictors_[ni]->contains(key) && !next_tier(*next);
        need = s.host_missing;
      }
      if (admitted && ask_evictor && budget.free[ni] < need) {
        admitted = evictors_[ni]->admit(move.block);
      }
      if (admitted && budget.free[ni] < need) {
        // Arriving there already while that tier makes the room: a block with pages in both
        // tiers must not be chosen to make room for its own other pages.
        budget.arriving[ni].insert(key);
        const uint64_t short_by =
            free_in(*next, need - budget.free[ni], budget, skip, plan, depth + 1);
        admitted = short_by == 0 && budget.free[ni] >= need;
        if (!admitted) budget.arriving[ni].erase(key);
      }
      if (admitted) {
        budget.free[ni] -= need;
        budget.arriving[ni].insert(key);
        move.to = *next;
        move.frames_taken = static_cast<uint32_t>(need);
      } else if (*next == Tier::kHost && s.kept_in_memory && budget.free[ni] > 0) {
        // It cannot be dropped: as many of its pages go down as host memory has room for.
        const uint64_t down = std::min(need, budget.free[ni]);
        budget.free[ni] -= down;
        budget.arriving[ni].insert(key);
        move.to = *next;
        move.frames_taken = static_cast<uint32_t>(down);
        move.pages_down = static_cast<uint32_t>(down);
        move.frames_freed = s.evictable - s.host_missing + move.pages_down;
      } else {
        refused = true;
      }
    }
    // Nowhere to go, and a block kept in memory is never lost: only its HBM pages with a host
    // copy leave (the executor drops no other), so only they count as freed; none, and it is
    // passed by, or every round of room-making would plan it again and free nothing. The same
    // holds in host memory for a block an open sequence holds that has no NVMe copy and is not
    // written there (NVMe smaller than the blocks in use): only its pages HBM holds leave.
    // (In HBM such a block still counts: the executor stages it to NVMe through the reserve.)
    const bool in_use_stays = tier == Tier::kHost && s.referenced;
    if (!move.to && !clean && !move.shadowed && (s.kept_in_memory || in_use_stays)) {
      move.frames_freed = s.evictable - (tier == Tier::kHbm ? s.host_missing : s.hbm_missing);
      if (move.frames_freed == 0) {
        ++counters_.skipped;
        continue;
      }
    }
    if (move.to) {
      ++counters_.demotions;
    } else if (const auto [it, first] = budget.dropped.emplace(key, move.shadowed);
               !first && (it->second || move.shadowed)) {
      ++counters_.skipped;  // the copy this drop relies on is dropped in this plan: it stays
      continue;
    } else {
      ++(move.shadowed      ? counters_.shadowed_drops
         : move.clean_below ? counters_.clean_drops
                            : counters_.drops);
      if (refused) ++counters_.refused;
    }
    budget.free[ti] += move.frames_freed;
    freed += move.frames_freed;
    if (tier == Tier::kHost) budget.host_pages_leave.insert(key);
    plan.moves.push_back(move);
  }
  return freed >= frames ? 0 : frames - freed;
}

Result<ExecutionResult> execute_plan_metadata(PageTable& table,
                                              std::array<Evictor*, kNumTiers> evictors,
                                              const PlacementPlan& plan) {
  ExecutionResult result;
  for (const PlannedMove& m : plan.moves) {
    bool gained = false;
    bool source_empty = false;
    Status st = table.update(m.block.key, [&](EntryView& v) -> Status {
      gained = false;
      if (m.to == Tier::kNvme && v.state(CopyId::nvme()) == CopyState::kAbsent) {
        if (v.memory_ready_pages() != v.layers()) {
          return failed_precondition(
              "block " + to_string(m.block.key) +
              " has pages that are not in memory; cannot write its NVMe copy");
        }
        KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::nvme()).status());
        KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::nvme()));
        gained = true;
      }
      if (m.from == Tier::kNvme) {
        KVTIER_RETURN_IF_ERROR(v.drop(CopyId::nvme()));
      } else {
        uint32_t moved = 0;
        uint32_t down = 0;
        for (uint32_t i = 0; i < v.layers(); ++i) {
          const uint32_t l = v.layers() - 1 - i;  // highest first, as pages_down says
          const CopyId src = CopyId::page(m.from, l);
          if (v.state(src) != CopyState::kReady) continue;
          if (m.from == Tier::kHbm && v.pins(l) != 0) continue;
          if (m.to == Tier::kHost && v.state(CopyId::host(l)) == CopyState::kAbsent) {
            if (m.pages_down != 0 && down == m.pages_down) continue;  // stays in HBM
            ++down;
            KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::host(l)).status());
            KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::host(l)));
            gained = true;
          }
          KVTIER_RETURN_IF_ERROR(v.begin_drain(src));
          KVTIER_RETURN_IF_ERROR(v.complete_drain(src));
          ++moved;
        }
        if (moved == 0) {
          return failed_precondition("block " + to_string(m.block.key) + " has no evictable " +
                                     std::string(tier_name(m.from)) + " copy any more");
        }
      }
      source_empty = v.copies(m.from) == 0;
      return ok_status();
    });
    if (!st.ok()) {
      if (st.code() == StatusCode::kNotFound || st.code() == StatusCode::kFailedPrecondition ||
          st.code() == StatusCode::kResourceExhausted) {
        ++result.skipped;
        continue;
      }
      return st;
    }
    ++result.executed;
    if (gained && m.to) {
      Evictor* dst = evictors[static_cast<std::size_t>(tier_index(*m.to))];
      if (dst != nullptr && !dst->contains(m.block.key)) dst->on_insert(m.block);
    }
    if (source_empty) {
      Evictor* src = evictors[static_cast<std::size_t>(tier_index(m.from))];
      if (src != nullptr && src->contains(m.block.key)) src->on_erase(m.block.key);
    }
    report_shadowed(table, evictors, m.block.key);
  }
  return result;
}

void report_shadowed(const PageTable& table, std::array<Evictor*, kNumTiers> evictors,
                     const BlockKey& key) {
  std::array<bool, kNumTiers> shadowed{};
  if (!table
           .visit(key,
                  [&](const EntryView& v) {
                    for (Tier t : {Tier::kHost, Tier::kNvme})
                      shadowed[tier_index(t)] = v.shadowed(t);
                  })
           .ok()) {
    return;  // gone: every copy left, and the evictors heard on_erase
  }
  for (Tier t : {Tier::kHost, Tier::kNvme}) {
    Evictor* e = evictors[static_cast<std::size_t>(tier_index(t))];
    if (e != nullptr && e->contains(key)) e->on_shadowed(key, shadowed[tier_index(t)]);
  }
}

}  // namespace kvtier
