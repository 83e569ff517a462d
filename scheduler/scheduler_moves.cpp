// Scheduler: the ground moves stand on — page snapshots, waiting on copies in flight, frames and
// the room they need — and each tier's evictor kept in step with the table. Promotions are in
// scheduler_promote.cpp, demotions in scheduler_demote.cpp; scheduler.hpp has the rules.
#include <algorithm>

#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Reading the table cheaply
// ---------------------------------------------------------------------------------------------

PageSnapshot Scheduler::page_snapshot(const BlockKey& key, uint32_t layer) const {
  PageSnapshot snap;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    snap.found = true;
    snap.hbm = v.state(CopyId::hbm(layer));
    snap.host = v.state(CopyId::host(layer));
    snap.nvme = v.state(CopyId::nvme());
    snap.hbm_frame = v.frame(CopyId::hbm(layer));
    snap.host_frame = v.frame(CopyId::host(layer));
    snap.pins = v.pins(layer);
  });
  s.ignore();  // not found reads as found = false
  return snap;
}

// ---------------------------------------------------------------------------------------------
// Waiting on copies in flight
// ---------------------------------------------------------------------------------------------

void Scheduler::attach(const PageKey& page, Done done) {
  auto it = ops_.find(page);
  if (it == ops_.end()) {
    done(ok_status());  // nothing in flight any more: the caller re-reads the state
    return;
  }
  it->second->waiters.push_back(std::move(done));
}

void Scheduler::finish_op(const PageKey& page, const Status& status) {
  // The outcome is handled here: told to the op's waiters, if it still has any (the caller has
  // already counted a failure and dropped what it could not complete).
  status.ignore();
  auto it = ops_.find(page);
  if (it == ops_.end()) return;
  std::unique_ptr<PageOp> op = std::move(it->second);
  ops_.erase(it);
  tell_waiters(page, *op, status);
}

void Scheduler::finish_ops(std::span<const PageKey> pages, const Status& status) {
  // Every op ends before any waiter runs: a waiter may start a transfer of the same pages (a
  // whole-block read's waiter planning the block's write to NVMe), whose ops must not meet these.
  status.ignore();
  std::vector<std::pair<PageKey, std::unique_ptr<PageOp>>> ended;
  for (const PageKey& page : pages) {
    auto it = ops_.find(page);
    if (it == ops_.end()) continue;
    ended.emplace_back(page, std::move(it->second));
    ops_.erase(it);
  }
  for (auto& [page, op] : ended) tell_waiters(page, *op, status);
}

void Scheduler::tell_waiters(const PageKey& page, PageOp& op, const Status& status) {
  // An HBM prefetch no step joined in flight: it arrived ahead of need (or failed, or was never
  // needed). Those a step joined were counted when it did (demand_prefetched).
  if (op.prefetch && page.tier == Tier::kHbm) {
    stats_.prefetches.fetch_add(1, std::memory_order_relaxed);
  }
  // A hint's load that arrived with no step asking for it: speculative until a request reuses the
  // block (open_sequence) or its copies go, unless a sequence holds it already. Counted once per
  // block and tier.
  if (op.hinted && op.prefetch && status.ok()) {
    const Result<bool> marked = parts_.table->mark_hinted(page.key, page.tier);
    if (marked.ok() && *marked) {
      stats_.hinted_loads[tier_index(page.tier)].fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (Done& d : op.waiters) d(status);
  if (page.key.is_private()) after_change(page.key);
  if (page.key.is_private() && !pending_publish_.empty()) {
    // A deferred publish may be possible now; run it as its own task, outside this completion.
    parts_.loop->post([this] { publish_pending(); });
  }
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------

uint64_t Scheduler::reserve_frames(Tier tier) const {
  // Host memory keeps two blocks' worth of frames that only NVMe staging may take, so a block split
  // between HBM and host can always be written down and free the rest (see stage_to_nvme); a
  // demand read from NVMe may borrow one of the two (reserve_left_to). Only with an NVMe tier, and
  // only when the pool is large enough to spare them.
  if (tier != Tier::kHost || parts_.nvme == nullptr) return 0;
  const uint64_t reserve = 2ull * options_.geometry.layers;
  return parts_.host->capacity() >= 8 * reserve ? reserve : 0;
}

uint64_t Scheduler::reserve_left_to(Tier tier, TransferPriority prio, FrameUse use) const {
  const uint64_t reserve = reserve_frames(tier);
  if (use != FrameUse::kNvmeRead || prio != TransferPriority::kDemand) return reserve;
  return reserve - std::min<uint64_t>(reserve, options_.geometry.layers);
}

void Scheduler::request_reserved_host_frame(const BlockKey& key, uint32_t layer,
                                            FrameGranted granted) {
  if (staging_waiters_.empty() && parts_.host->free_count() > 0) {
    auto frame = parts_.table->begin_fill(key, CopyId::host(layer));
    if (frame.ok() || frame.status().code() != StatusCode::kResourceExhausted) {
      granted(std::move(frame));
      return;
    }
  }
  staging_waiters_.push_back(FrameWaiter{key, layer, std::move(granted)});
}

void Scheduler::request_frame(Tier tier, const BlockKey& key, uint32_t layer, TransferPriority prio,
                              FrameGranted granted, FrameUse use) {
  auto& queues = waiters_[tier_index(tier)];
  // Queue behind requests of the same or a higher priority; otherwise try at once.
  bool queued_ahead = false;
  for (int p = 0; p <= static_cast<int>(prio); ++p)
    queued_ahead = queued_ahead || !queues[p].empty();
  if (!queued_ahead && frames(tier)->free_count() > reserve_left_to(tier, prio, use)) {
    auto frame = parts_.table->begin_fill(key, CopyId::page(tier, layer));
    if (frame.ok() || frame.status().code() != StatusCode::kResourceExhausted) {
      granted(std::move(frame));
      return;
    }
  }
  queues[static_cast<int>(prio)].push_back(FrameWaiter{key, layer, std::move(granted), use});
  make_room(tier, prio);
  serve_frame_waiters(tier);
}

void Scheduler::promote_frame_waiters(Tier tier, const BlockKey& key, TransferPriority to,
                                      uint32_t layer) {
  auto& queues = waiters_[tier_index(tier)];
  bool moved = false;
  for (int p = static_cast<int>(to) + 1; p < kNumPriorities; ++p) {
    auto& q = queues[p];
    for (auto it = q.begin(); it != q.end();) {
      if (it->key == key && (layer == kAllLayers || it->layer == layer)) {
        queues[static_cast<int>(to)].push_back(std::move(*it));
        it = q.erase(it);
        moved = true;
      } else {
        ++it;
      }
    }
  }
  if (!moved) return;
  make_room(tier, to);
  serve_frame_waiters(tier);
}

void Scheduler::serve_frame_waiters(Tier tier) {
  if (tier == Tier::kNvme || serving_[tier_index(tier)]) return;
  // Grants may free or take frames re-entrantly (a grant's callback can drop a copy); one serving
  // pass at a time per tier, repeated until nothing changes.
  serving_[tier_index(tier)] = true;
  auto& queues = waiters_[tier_index(tier)];
  const uint64_t reserve = reserve_frames(tier);
  bool planned = false;
  while (true) {
    bool granted_any = false;
    if (tier == Tier::kHost) {
      while (!staging_waiters_.empty() && frames(tier)->free_count() > 0) {
        FrameWaiter w = std::move(staging_waiters_.front());
        staging_waiters_.pop_front();
        auto frame = parts_.table->begin_fill(w.key, CopyId::host(w.layer));
        if (!frame.ok() && frame.status().code() == StatusCode::kResourceExhausted) {
          staging_waiters_.push_front(std::move(w));
          break;
        }
        w.granted(std::move(frame));
        granted_any = true;
      }
    }
    for (int p = 0; p < kNumPriorities; ++p) {
      auto& q = queues[p];
      const auto prio = static_cast<TransferPriority>(p);
      const uint64_t copy_floor = reserve_left_to(tier, prio, FrameUse::kCopy);
      const uint64_t read_floor = reserve_left_to(tier, prio, FrameUse::kNvmeRead);
      const auto may_take = [&](const FrameWaiter& w) {
        return frames(tier)->free_count() >
               (w.use == FrameUse::kNvmeRead ? read_floor : copy_floor);
      };
      while (!q.empty()) {
        // In order, except that a demand read from NVMe passes requests held at the reserve
        // (searched for only when such a read could take a frame the others cannot).
        const uint64_t free = frames(tier)->free_count();
        const bool read_may_pass = read_floor < free && free <= copy_floor;
        auto next = may_take(q.front()) ? q.begin()
                    : read_may_pass     ? std::find_if(q.begin(), q.end(), may_take)
                                        : q.end();
        if (next == q.end()) break;
        FrameWaiter w = std::move(*next);
        q.erase(next);
        auto frame = parts_.table->begin_fill(w.key, CopyId::page(tier, w.layer));
        if (!frame.ok() && frame.status().code() == StatusCode::kResourceExhausted) {
          q.push_front(std::move(w));
          break;
        }
        w.granted(std::move(frame));
        granted_any = true;
      }
      if (!q.empty()) break;  // lower priorities wait behind a blocked higher one
    }
    const bool waiting =
        std::any_of(queues.begin(), queues.end(), [](const auto& q) { return !q.empty(); });
    if (!waiting) break;
    if (frames(tier)->free_count() <= reserve && !planned) {
      // Still short: plan room once per pass (moves already in flight are counted as free).
      make_room(tier, TransferPriority::kDemand);
      planned = true;
      continue;
    }
    if (!granted_any) break;
  }
  serving_[tier_index(tier)] = false;
  // Still short after planning, with no host frame free beyond the reserve, none on its way and
  // no transfer left that could change that: only the engine can free one now (host memory is
  // full of pages that cannot move), so HBM demotions and reads from NVMe stop waiting for it: a
  // step's read fails the step at once (kUnavailable) rather than at its timeout. Plans will not
  // demote into host memory again meanwhile (room_for_plans gives them no host room).
  if (tier == Tier::kHost && links_.idle() && host_has_nothing_for_demotions()) {
    withdraw_host_requests(nullptr, Withdrawn::kDemotionsAndReads,
                           "host memory has no frame to give and none on its way");
  }
}

void Scheduler::serve_memory_waiters() {
  // A transfer that read a block kept it out of every room-making plan (reading_); once it ends,
  // requests that found nothing to evict must look again, in HBM as well as in host memory, or
  // they wait for an event that never comes (HBM waiters starved behind cached blocks whose host
  // copies were being read from NVMe or written to it).
  serve_frame_waiters(Tier::kHost);
  serve_frame_waiters(Tier::kHbm);
}

bool Scheduler::SkipFilter::operator()(const BlockKey& key) const {
  // Blocks with a page under a transfer keep their frames until it ends; pinned prefixes stay in
  // HBM. (Private blocks may move down like any other — never dropped, see may_lose_last_copy —
  // which only delays their publishing until the transfer ends.)
  return scheduler->reading_.contains(key) ||
         (tier == Tier::kHbm && scheduler->protected_.contains(key)) ||
         (tried != nullptr && tried->contains(key)) ||
         (tier == Tier::kHost && scheduler->host_pages_stuck(key));
}

bool Scheduler::host_pages_stuck(const BlockKey& key) const {
  // Mirrors execute_move for host memory: a block in use whose host pages are each the last copy
  // of their layer, and that can be neither written to NVMe whole nor staged there, frees nothing
  // now. Skipping it up front keeps room-making from planning (and re-planning) around it, which
  // costs a round per such block ahead of the first one that can go.
  // What execute_move may do with it besides dropping: write it whole to NVMe, or stage its HBM
  // pages down first (neither toward a tier that refused it). Looked up outside the shard lock.
  // A private block cannot go to NVMe (addressed by content key): only the host pages whose HBM
  // copy is ready may leave, which is what lets HBM and host trade pages when both are full of
  // blocks in use (a page brought up frees its host frame for one going down).
  const bool nvme_open = nvme_takes(key);
  const bool host_open = !refused(key, Tier::kHost);
  bool stuck = false;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    if (v.refcount() == 0 || v.state(CopyId::nvme()) == CopyState::kReady) return;
    bool any_host = false, any_safe = false, all_safe = true, all_host = true, stageable = true;
    for (uint32_t l = 0; l < v.layers(); ++l) {
      const CopyState h = v.state(CopyId::hbm(l));
      const CopyState m = v.state(CopyId::host(l));
      if (m == CopyState::kReady) {
        any_host = true;
        any_safe = any_safe || h == CopyState::kReady;
        all_safe = all_safe && h == CopyState::kReady;
      } else {
        all_host = false;
        stageable = stageable && m == CopyState::kAbsent && h == CopyState::kReady;
      }
    }
    // Nothing ready here (the placement passes it by anyway), or no last copy: all droppable.
    if (!any_host || all_safe) return;
    const bool to_nvme = nvme_open && v.state(CopyId::nvme()) == CopyState::kAbsent;
    if (to_nvme) {
      stuck = !all_host && !(stageable && host_open);  // written whole, or staged; else stays
    } else {
      stuck = !any_safe;  // only pages with an HBM copy may be dropped
    }
  });
  return s.ok() && stuck;
}

uint64_t Scheduler::frames_awaited(Tier tier) const {
  if (tier == Tier::kNvme) return 0;
  uint64_t n = 0;
  for (const auto& q : waiters_[tier_index(tier)]) n += q.size();
  return n;
}

bool Scheduler::host_has_nothing_for_demotions() const {
  return parts_.host->free_count() <= reserve_frames(Tier::kHost) &&
         draining_[tier_index(Tier::kHost)] == 0;
}

bool Scheduler::host_takes_demotion_of(const BlockKey& key) const {
  uint64_t pages = 0;  // HBM pages that a demotion would copy down
  for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
    const PageSnapshot p = page_snapshot(key, l);
    pages += p.hbm == CopyState::kReady && p.host == CopyState::kAbsent;
  }
  return room_for_plans(Tier::kHbm)[tier_index(Tier::kHost)] >= pages;
}

std::array<uint64_t, kNumTiers> Scheduler::room_for_plans(Tier asked) const {
  std::array<uint64_t, kNumTiers> room{};
  for (Tier t : kAllTiers) {
    const uint64_t f = t == Tier::kNvme ? (parts_.nvme != nullptr ? parts_.nvme->free_count() : 0)
                                        : frames(t)->free_count();
    room[tier_index(t)] = f + draining_[tier_index(t)];
    if (t == Tier::kHbm && demotions_awaiting_host_ > 0 && host_has_nothing_for_demotions()) {
      // Pages waiting for a host frame that host memory has neither free nor on its way: they
      // may wait for good (host memory full of pages that cannot move), so they are no room.
      room[tier_index(t)] -= std::min(room[tier_index(t)], demotions_awaiting_host_);
    }
    if (t == asked) continue;
    const uint64_t spoken_for = reserve_frames(t) + frames_awaited(t);
    room[tier_index(t)] -= std::min(room[tier_index(t)], spoken_for);
  }
  return room;
}

void Scheduler::make_room(Tier tier, TransferPriority prio) {
  give_back_pins_ahead();
  if (tier == Tier::kHbm && parts_.host->free_count() + draining_[tier_index(Tier::kHost)] <
                                reserve_frames(Tier::kHost)) {
    // HBM's room is made by demotions into host memory, which never take its reserve. Host memory
    // below its reserve (reads from NVMe borrow from it) gets that back first: the plan below
    // counts no host room until it has, and would demote into frames that host room-making
    // freed but the reserve kept.
    make_room(Tier::kHost, prio);
  }
  uint64_t waiting = reserve_frames(tier) + frames_awaited(tier);
  if (tier == Tier::kHost) waiting += staging_waiters_.size();
  std::array<uint64_t, kNumTiers> free = room_for_plans(tier);
  if (waiting <= free[tier_index(tier)]) return;
  // A plan's estimate can be more than a move achieves (a page is the last copy of a block in use
  // whose other pages are still being written, so it can neither be dropped nor staged to NVMe);
  // blocks whose move freed nothing are left out and room is planned again. The blocks that can
  // go may rank behind any number that cannot, so the skip filter rules out up front what is known
  // to free nothing (host_pages_stuck), and the rounds go on while they free frames; a bounded
  // number of fruitless rounds keeps the cost of a call linear in what it tries.
  // Each fruitless round asks the plan for twice the room of the one before, so the rounds reach
  // past up to a couple of hundred blocks that free nothing (blocks in use whose HBM pages are
  // their last copies, with no host room and NVMe full of blocks in use) to those that do (pages
  // NVMe also holds); the moves stop once the room is made, so asking more evicts no more.
  constexpr int kFruitlessRounds = 8;
  std::unordered_set<BlockKey, BlockKeyHash> tried;
  for (int fruitless = 0; waiting > free[tier_index(tier)] && fruitless < kFruitlessRounds;) {
    const uint64_t short_by = waiting - free[tier_index(tier)];
    const SkipFilters skip(this, &tried);
    const PlacementPlan plan = placement_->plan_room(
        tier, free[tier_index(tier)] + (short_by << fruitless), free, skip.per_tier());
    if (plan.moves.empty()) return;
    uint64_t freed = 0;
    for (const PlannedMove& move : plan.moves) {
      if (move.from != tier) {
        execute_move(move, prio);  // room made below for a demotion that follows
        continue;
      }
      if (freed >= short_by) break;
      const uint64_t f = execute_move(move, prio);
      if (f == 0) tried.insert(move.block.key);
      freed += f;
    }
    if (freed >= short_by) return;
    // The tiers below gave some of their room to this round's demotions: asked afresh.
    const uint64_t asked_free = free[tier_index(tier)] + freed;
    free = room_for_plans(tier);
    free[tier_index(tier)] = asked_free;
    fruitless = freed == 0 ? fruitless + 1 : 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Membership and clean-up
// ---------------------------------------------------------------------------------------------

void Scheduler::sync_membership(const BlockKey& key, Tier tier) {
  Evictor* e = evictor(tier);
  if (e == nullptr) return;
  bool has = false;
  BlockFacts facts;
  facts.key = key;
  bool faster_copy = false;
  bool shadowed = false;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    facts.parent = v.parent();
    facts.hits = v.stats().hits;
    if (tier == Tier::kNvme) {
      has = v.state(CopyId::nvme()) == CopyState::kReady;
    } else {
      for (uint32_t l = 0; l < v.layers() && !has; ++l) {
        has = v.state(CopyId::page(tier, l)) == CopyState::kReady;
      }
    }
    faster_copy = tier != Tier::kHbm && v.copies(Tier::kHbm) > 0;
    shadowed = v.shadowed(tier);
  });
  if (!s.ok()) has = false;
  if (has && !e->contains(key)) {
    const RequestFacts rf = facts_of(key);
    facts.depth = rf.depth;
    facts.request_hit_blocks = rf.request_hit_blocks;
    facts.request_blocks = rf.request_blocks;
    // Carry what a faster tier's policy knew about the block.
    for (Tier t : kAllTiers) {
      if (t == tier) continue;
      if (Evictor* other = evictor(t); other != nullptr && other->contains(key)) {
        other->describe(key, facts);
        break;
      }
    }
    facts.demoted = faster_copy;
    e->on_insert(facts);
  } else if (!has && e->contains(key)) {
    e->on_erase(key);
  }
  if (has) e->on_shadowed(key, shadowed);
}

void Scheduler::after_change(const BlockKey& key) {
  uint32_t refs = 1;
  const bool found =
      parts_.table->visit(key, [&](const EntryView& v) { refs = v.refcount(); }).ok();
  if (found && refs == 0) {
    // No open sequence holds it (any more): a policy that kept it for one ranks it again.
    for (Tier t : kAllTiers) {
      Evictor* e = evictor(t);
      if (e != nullptr && e->contains(key)) e->on_released(key);
    }
    // A private block nobody references any more (its sequence closed or its step was aborted
    // while a copy was in flight) holds K/V no one can match: give its copies back.
    if (key.is_private()) {
      for (Tier t : {Tier::kHbm, Tier::kHost}) parts_.table->drop_all(key, t).status().ignore();
    }
  }
  for (Tier t : kAllTiers) sync_membership(key, t);
  // A block with no copy, no reference and no cached child is forgotten (its parent may follow).
  BlockKey current = key;
  for (int guard = 0; guard < 1024 && !current.is_null(); ++guard) {
    bool erase = false;
    BlockKey parent;
    Status s = parts_.table->visit(current, [&](const EntryView& v) {
      parent = v.parent();
      erase = v.refcount() == 0 && v.cached_children() == 0 && v.copies(Tier::kHbm) == 0 &&
              v.copies(Tier::kHost) == 0 && v.state(CopyId::nvme()) == CopyState::kAbsent &&
              v.pinned_pages() == 0;
    });
    if (!s.ok() || !erase) return;
    for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
      if (ops_.contains(PageKey{current, l, Tier::kHbm}) ||
          ops_.contains(PageKey{current, l, Tier::kHost})) {
        return;
      }
    }
    if (!parts_.table->erase(current).ok()) return;
    facts_.erase(current);
    refused_.erase(current);
    lost_blocks_.erase(current);
    if (!failed_fills_.empty()) {
      for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
        failed_fills_.erase(PageKey{current, l, Tier::kHbm});
      }
    }
    current = parent;
  }
}

}  // namespace kvtier
