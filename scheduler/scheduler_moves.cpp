// Scheduler: moving pages — promotions (NVMe -> host -> HBM), frames and the room they need,
// demotions and evictions, write-through, watermarks, and the evictors' view of each tier.
// See scheduler.hpp for the rules these follow.
#include <algorithm>
#include <string>

#include "kvtier/log.hpp"
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
  auto it = ops_.find(page);
  if (it == ops_.end()) return;
  std::unique_ptr<PageOp> op = std::move(it->second);
  ops_.erase(it);
  // An HBM prefetch no step joined in flight: it arrived ahead of need (or failed, or was never
  // needed). Those a step joined were counted when it did (demand_prefetched).
  if (op->prefetch && page.tier == Tier::kHbm) {
    stats_.prefetches.fetch_add(1, std::memory_order_relaxed);
  }
  for (Done& d : op->waiters) d(status);
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
  // between HBM and host can always be written down and free the rest (see stage_to_nvme). Only
  // with an NVMe tier, and only when the pool is large enough to spare them.
  if (tier != Tier::kHost || parts_.nvme == nullptr) return 0;
  const uint64_t reserve = 2ull * options_.geometry.layers;
  return parts_.host->capacity() >= 8 * reserve ? reserve : 0;
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
                              FrameGranted granted) {
  auto& queues = waiters_[tier_index(tier)];
  // Queue behind requests of the same or a higher priority; otherwise try at once.
  bool queued_ahead = false;
  for (int p = 0; p <= static_cast<int>(prio); ++p)
    queued_ahead = queued_ahead || !queues[p].empty();
  if (!queued_ahead && frames(tier)->free_count() > reserve_frames(tier)) {
    auto frame = parts_.table->begin_fill(key, CopyId::page(tier, layer));
    if (frame.ok() || frame.status().code() != StatusCode::kResourceExhausted) {
      granted(std::move(frame));
      return;
    }
  }
  queues[static_cast<int>(prio)].push_back(FrameWaiter{key, layer, std::move(granted)});
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
    for (auto& q : queues) {
      while (!q.empty() && frames(tier)->free_count() > reserve) {
        FrameWaiter w = std::move(q.front());
        q.pop_front();
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
  // A private block cannot leave host memory at all (NVMe is addressed by content key), so it is
  // never a host victim.
  return scheduler->reading_.contains(key) ||
         (tier == Tier::kHbm && scheduler->protected_.contains(key)) ||
         (tier != Tier::kHbm && key.is_private()) || (tried != nullptr && tried->contains(key)) ||
         (tier == Tier::kHost && scheduler->host_pages_stuck(key));
}

bool Scheduler::host_pages_stuck(const BlockKey& key) const {
  // Mirrors execute_move for host memory: a block in use whose host pages are each the last copy
  // of their layer, and that can be neither written to NVMe whole nor staged there, frees nothing
  // now. Skipping it up front keeps room-making from planning (and re-planning) around it, which
  // costs a round per such block ahead of the first one that can go.
  // What execute_move may do with it besides dropping: write it whole to NVMe, or stage its HBM
  // pages down first (neither toward a tier that refused it). Looked up outside the shard lock.
  const bool nvme_open = parts_.nvme != nullptr && !refused(key, Tier::kNvme);
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

void Scheduler::make_room(Tier tier, TransferPriority prio) {
  uint64_t waiting = reserve_frames(tier);
  for (const auto& q : waiters_[tier_index(tier)]) waiting += q.size();
  if (tier == Tier::kHost) waiting += staging_waiters_.size();
  std::array<uint64_t, kNumTiers> free{};
  for (Tier t : kAllTiers) {
    const uint64_t f = t == Tier::kNvme ? (parts_.nvme != nullptr ? parts_.nvme->free_count() : 0)
                                        : frames(t)->free_count();
    free[tier_index(t)] = f + draining_[tier_index(t)];
  }
  if (waiting <= free[tier_index(tier)]) return;
  // A plan's estimate can be more than a move achieves (a page is the last copy of a block in use
  // whose other pages are still being written, so it can neither be dropped nor staged to NVMe);
  // blocks whose move freed nothing are left out and room is planned again. The blocks that can
  // go may rank behind any number that cannot, so the skip filter rules out up front what is known
  // to free nothing (host_pages_stuck), and the rounds go on while they free frames; a bounded
  // number of fruitless rounds keeps the cost of a call linear in what it tries.
  constexpr int kFruitlessRounds = 8;
  std::unordered_set<BlockKey, BlockKeyHash> tried;
  for (int fruitless = 0; waiting > free[tier_index(tier)] && fruitless < kFruitlessRounds;) {
    const SkipFilter skip{this, tier, &tried};
    const PlacementPlan plan = placement_->plan_room(tier, waiting, free, KeyFilter(skip));
    if (plan.moves.empty()) return;
    uint64_t freed = 0;
    for (const PlannedMove& move : plan.moves) {
      if (move.from != tier) {
        execute_move(move, prio);  // room made below for a demotion that follows
        continue;
      }
      const uint64_t f = execute_move(move, prio);
      if (f == 0) tried.insert(move.block.key);
      freed += f;
    }
    if (freed >= waiting - free[tier_index(tier)]) return;
    free[tier_index(tier)] += freed;
    fruitless = freed == 0 ? fruitless + 1 : 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Promotions
// ---------------------------------------------------------------------------------------------

void Scheduler::ensure_in_hbm(const BlockKey& key, uint32_t layer, TransferPriority prio,
                              std::function<void(uint32_t)> on_filling, Done done) {
  const PageKey pk{key, layer, Tier::kHbm};
  const PageSnapshot p = page_snapshot(key, layer);
  if (!p.found) {
    done(not_found("block " + to_string(key) + " is not in the page table"));
    return;
  }
  switch (p.hbm) {
    case CopyState::kReady:
      if (on_filling) on_filling(p.hbm_frame);
      done(ok_status());
      return;
    case CopyState::kFilling: {
      auto it = ops_.find(pk);
      if (it == ops_.end()) {
        if (auto w = engine_writes_.find(pk); w != engine_writes_.end()) {
          // A refilled block another step is writing: it was matchable all along (its copies
          // below are complete), but this copy is not written yet. Ask again once it is.
          w->second.push_back([this, key, layer, prio, on_filling = std::move(on_filling),
                               done = std::move(done)]() mutable {
            ensure_in_hbm(key, layer, prio, std::move(on_filling), std::move(done));
          });
          return;
        }
        if (failed_fills_.contains(pk)) {
          // Its load failed while pinned: the frame holds whatever the copy left. A miss, never
          // served; the page is aborted when its pins go.
          done(unavailable("page " + to_string(key) + " layer " + std::to_string(layer) +
                           ": its load into HBM failed; it is given up when unpinned"));
          return;
        }
        // Filled by the engine of another step (a page it writes): it is as good as ready for a
        // reader pinned behind it in the same step order.
        if (on_filling) on_filling(p.hbm_frame);
        done(ok_status());
        return;
      }
      PageOp& op = *it->second;
      const bool promote = op.prefetch && prio == TransferPriority::kDemand;
      if (on_filling) on_filling(p.hbm_frame);
      op.waiters.push_back(std::move(done));
      if (promote) demand_prefetched(key, layer);  // last: it may grant frames at once
      return;
    }
    case CopyState::kDraining:
      // Leaving for host memory: wait until the copy there is complete, then load it back.
      attach(pk, [this, key, layer, prio, on_filling = std::move(on_filling),
                  done = std::move(done)](const Status&) mutable {
        ensure_in_hbm(key, layer, prio, std::move(on_filling), std::move(done));
      });
      return;
    case CopyState::kAbsent: break;
  }
  // Absent: one fill for everyone who asks until it completes.
  if (auto it = ops_.find(pk); it != ops_.end()) {
    PageOp& op = *it->second;
    const bool promote = op.prefetch && prio == TransferPriority::kDemand;
    if (on_filling) {
      if (op.frame) {
        on_filling(*op.frame);
      } else {
        op.on_frame.push_back(std::move(on_filling));
      }
    }
    op.waiters.push_back(std::move(done));
    // Last: promoting may grant frames (and run the grant's callbacks) at once.
    if (promote) demand_prefetched(key, layer);
    return;
  }
  auto op = std::make_unique<PageOp>();
  op->prefetch = prio != TransferPriority::kDemand;
  op->issued = parts_.loop->now();
  if (on_filling) op->on_frame.push_back(std::move(on_filling));
  op->waiters.push_back(std::move(done));
  ops_.emplace(pk, std::move(op));

  load_via_host(key, layer, prio);
}

// From here on the load is a demand (promoted on its link if it is queued there). Prefetches are
// counted as they resolve: here a late one, still in flight when a step needed it, or, in
// finish_op, one that arrived first. A load a step joins at the very instant it was issued had no
// lead to lose: a sequence opened and stepped at once (open_sequence prefetches the reused
// prefix, begin_step then demands its first layers) is a demand load, counted as neither. In the
// 3x trace run with an fp8 host, these were 401,608 of the 405,640 loads counted late before.
//
// The load is promoted in whatever phase it is: its copy up queued on the link (op.job); or still
// in its host phase (the host copy arriving from NVMe, maybe with the whole block, possibly still
// waiting for host frames), whose read moves up; or waiting in the HBM frame queue at prefetch
// priority, whose request moves to the demand queue. (A load with its HBM frame in hand whose host
// copy left meanwhile is fetching it again: that read moves up too.)
void Scheduler::demand_prefetched(const BlockKey& key, uint32_t layer) {
  auto it = ops_.find(PageKey{key, layer, Tier::kHbm});
  if (it == ops_.end() || !it->second->prefetch) return;
  PageOp& op = *it->second;
  op.prefetch = false;
  if (parts_.loop->now() > op.issued) {
    stats_.prefetches.fetch_add(1, std::memory_order_relaxed);
    stats_.late_prefetches.fetch_add(1, std::memory_order_relaxed);
  }
  if (op.job != 0) {
    links_.promote(op.job, TransferPriority::kDemand);
    return;
  }
  const bool has_frame = op.frame.has_value();
  // Either may grant frames at once and run their callbacks (which may end `op`): `op` is not
  // used past here.
  demand_host_read(key, layer);
  if (!has_frame) promote_frame_waiters(Tier::kHbm, key, TransferPriority::kDemand, layer);
}

bool Scheduler::demand_host_op(const BlockKey& key, uint32_t layer) {
  auto it = ops_.find(PageKey{key, layer, Tier::kHost});
  if (it == ops_.end() || !it->second->prefetch) return false;
  PageOp& op = *it->second;
  op.prefetch = false;
  if (op.job != 0) links_.promote(op.job, TransferPriority::kDemand);
  return true;
}

void Scheduler::demand_host_read(const BlockKey& key, uint32_t layer) {
  // A whole-block read starts once every layer has its frame: all of the block's requests move.
  if (demand_host_op(key, layer)) {
    promote_frame_waiters(Tier::kHost, key, TransferPriority::kDemand);
  }
}

void Scheduler::load_via_host(const BlockKey& key, uint32_t layer, TransferPriority prio) {
  const PageKey pk{key, layer, Tier::kHbm};
  ensure_in_host(key, layer, prio, [this, key, layer, prio, pk](const Status& s) {
    if (!s.ok()) {
      finish_op(pk, s);
      return;
    }
    // The load may have become a demand while the host copy arrived.
    auto it = ops_.find(pk);
    const TransferPriority now_prio =
        it != ops_.end() && !it->second->prefetch ? TransferPriority::kDemand : prio;
    request_frame(Tier::kHbm, key, layer, now_prio,
                  [this, key, layer, pk, now_prio](Result<uint32_t> frame) {
                    if (!frame.ok()) {
                      // Overtaken while it waited for the frame: a refill's engine writes the
                      // page (or has written it). Not a failed load: read what is written.
                      const CopyState now = page_snapshot(key, layer).hbm;
                      if (frame.status().code() == StatusCode::kFailedPrecondition &&
                          (now == CopyState::kFilling || now == CopyState::kReady)) {
                        rejoin_load_waiters(pk);
                        return;
                      }
                      finish_op(pk, frame.status());
                      return;
                    }
                    if (auto it = ops_.find(pk); it != ops_.end()) {
                      it->second->frame = *frame;
                      auto fns = std::move(it->second->on_frame);
                      for (auto& fn : fns) fn(*frame);
                    }
                    copy_up(key, layer, now_prio, *frame, 0);
                  });
  });
}

void Scheduler::rejoin_load_waiters(const PageKey& page) {
  auto it = ops_.find(page);
  if (it == ops_.end()) return;
  std::unique_ptr<PageOp> op = std::move(it->second);
  ops_.erase(it);
  const TransferPriority prio =
      op->prefetch ? TransferPriority::kPrefetch : TransferPriority::kDemand;
  // The op took no frame, so none of its on_frame callbacks ran: each asks again, before the
  // waiters (a step pins the page before it learns that the page arrived).
  for (auto& on_frame : op->on_frame) {
    ensure_in_hbm(page.key, page.layer, prio, std::move(on_frame),
                  [](const Status& s) { s.ignore(); });
  }
  for (Done& done : op->waiters)
    ensure_in_hbm(page.key, page.layer, prio, nullptr, std::move(done));
}

void Scheduler::copy_up(const BlockKey& key, uint32_t layer, TransferPriority prio,
                        uint32_t hbm_frame, int refetches) {
  // The HBM frame is held from here on, so a host copy that left while this load waited (evicted
  // down, or dropped) is fetched again and copied the moment it is back: no frame is given up and
  // taken again, so loads cannot chase each other's frames.
  constexpr int kMaxRefetches = 16;
  const PageKey pk{key, layer, Tier::kHbm};
  // A demand may have joined the load since it was issued (demand_prefetched).
  if (auto it = ops_.find(pk); it != ops_.end() && !it->second->prefetch) {
    prio = TransferPriority::kDemand;
  }
  const PageSnapshot src = page_snapshot(key, layer);
  if (src.host != CopyState::kReady) {
    if (refetches >= kMaxRefetches) {
      give_up_fill(key, layer);
      finish_op(pk, unavailable("page " + to_string(key) + " layer " + std::to_string(layer) +
                                " left host memory " + std::to_string(refetches) +
                                " times before it could be loaded"));
      return;
    }
    ensure_in_host(key, layer, prio,
                   [this, key, layer, prio, hbm_frame, refetches, pk](const Status& s) {
                     if (!s.ok()) {
                       give_up_fill(key, layer);
                       finish_op(pk, s);
                       serve_frame_waiters(Tier::kHbm);
                       return;
                     }
                     copy_up(key, layer, prio, hbm_frame, refetches + 1);
                   });
    return;
  }
  reading_[key] += 1;
  const JobId job = links_.enqueue(
      Link::kHostToHbm, prio, parts_.port->host_page_bytes(),
      [this, key, layer, pk, host_frame = src.host_frame,
       hbm_frame](std::function<void()> finished) {
        const FrameMove move{host_frame, hbm_frame};
        Status submitted = parts_.port->copy_pages(
            Link::kHostToHbm, std::span(&move, 1),
            [this, key, layer, pk, finished](const Status& s) {
              finished();
              if (--reading_[key] == 0) reading_.erase(key);
              if (s.ok()) {
                Status c = parts_.table->complete_fill(key, CopyId::hbm(layer));
                stats_.promotions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
                sync_membership(key, Tier::kHbm);
                finish_op(pk, c);
              } else {
                stats_.failed_loads.fetch_add(1, std::memory_order_relaxed);
                give_up_fill(key, layer);
                finish_op(pk, s.with_context("loading " + to_string(key) + " layer " +
                                             std::to_string(layer) + " into hbm"));
              }
              serve_frame_waiters(Tier::kHost);
              serve_frame_waiters(Tier::kHbm);
            });
        if (!submitted.ok()) {
          finished();
          if (--reading_[key] == 0) reading_.erase(key);
          give_up_fill(key, layer);
          finish_op(pk, submitted);
        }
      });
  if (auto again = ops_.find(pk); again != ops_.end()) again->second->job = job;
}

void Scheduler::give_up_fill(const BlockKey& key, uint32_t layer) {
  parts_.table->abort_fill(key, CopyId::hbm(layer)).ignore();
  if (page_snapshot(key, layer).hbm == CopyState::kFilling) {
    failed_fills_.insert(PageKey{key, layer, Tier::kHbm});
  }
}

void Scheduler::ensure_in_host(const BlockKey& key, uint32_t layer, TransferPriority prio,
                               Done done) {
  const PageKey pk{key, layer, Tier::kHost};
  const PageSnapshot p = page_snapshot(key, layer);
  if (!p.found) {
    done(not_found("block " + to_string(key) + " is not in the page table"));
    return;
  }
  if (p.host == CopyState::kReady) {
    done(ok_status());
    return;
  }
  if (auto it = ops_.find(pk); it != ops_.end()) {
    // A transfer is in flight for this host page: arriving (a read, possibly of the whole block,
    // still waiting for frames) or leaving for NVMe. Wait for it; after a departure, read it back.
    PageOp& op = *it->second;
    const bool promote = op.prefetch && prio == TransferPriority::kDemand;
    const bool leaving = op.drain;
    op.waiters.push_back(
        [this, key, layer, prio, leaving, done = std::move(done)](const Status& s) {
          if (leaving) {
            ensure_in_host(key, layer, prio, done);  // gone to NVMe (read it back) or stayed
          } else {
            done(s);
          }
        });
    if (promote) demand_host_read(key, layer);  // last: it may grant frames at once
    return;
  }
  if (p.host == CopyState::kFilling) {
    // Filled by a copy down from HBM (a demotion or a write-through), tracked on the HBM side; the
    // HBM copy is still valid, so the caller can use it.
    done(ok_status());
    return;
  }
  if (p.host == CopyState::kDraining) {
    done(unavailable("host page " + to_string(key) + " layer " + std::to_string(layer) +
                     " is leaving without a tracked transfer"));
    return;
  }
  if (p.nvme != CopyState::kReady) {
    done(not_found("page " + to_string(key) + " layer " + std::to_string(layer) +
                   " has no copy in host memory or on nvme"));
    return;
  }
  auto op = std::make_unique<PageOp>();
  op->prefetch = prio != TransferPriority::kDemand;
  op->waiters.push_back(std::move(done));
  ops_.emplace(pk, std::move(op));
  request_frame(
      Tier::kHost, key, layer, prio, [this, key, layer, prio, pk](Result<uint32_t> frame) {
        if (!frame.ok()) {
          finish_op(pk, frame.status());
          return;
        }
        const uint32_t host_frame = *frame;
        reading_[key] += 1;  // the NVMe extent is read: keep it
        const JobId job = links_.enqueue(
            Link::kNvmeToHost, prio, parts_.port->nvme_page_bytes(),
            [this, key, layer, pk, host_frame](std::function<void()> finished) {
              Status submitted = parts_.port->read_page(
                  key, layer, host_frame, [this, key, layer, pk, finished](const Status& s) {
                    finished();
                    if (--reading_[key] == 0) reading_.erase(key);
                    if (s.ok()) {
                      Status c = parts_.table->complete_fill(key, CopyId::host(layer));
                      stats_.promotions[tier_index(Tier::kHost)].fetch_add(
                          1, std::memory_order_relaxed);
                      sync_membership(key, Tier::kHost);
                      finish_op(pk, c);
                    } else {
                      stats_.failed_loads.fetch_add(1, std::memory_order_relaxed);
                      parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
                      // A block whose read failed (I/O error, checksum) is never served again.
                      drop_nvme_copy(key);
                      finish_op(pk, s.with_context("loading " + to_string(key) + " layer " +
                                                   std::to_string(layer) + " from nvme"));
                      after_change(key);
                    }
                    serve_memory_waiters();  // the block read is a victim again
                  });
              if (!submitted.ok()) {
                finished();
                if (--reading_[key] == 0) reading_.erase(key);
                parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
                finish_op(pk, submitted);
              }
            });
        if (auto again = ops_.find(pk); again != ops_.end()) again->second->job = job;
      });
}

void Scheduler::ensure_block_in_host(const BlockKey& key, TransferPriority prio) {
  // One large read when the block is on NVMe only (DESIGN.md: a whole-block read is one I/O).
  const uint32_t layers = options_.geometry.layers;
  bool any_host = false;
  CopyState nvme = CopyState::kAbsent;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    nvme = v.state(CopyId::nvme());
    any_host = v.copies(Tier::kHost) > 0;
  });
  if (!s.ok()) return;
  // A demand joins a read issued as a prefetch: the read moves up its link's queue, or, still
  // waiting for host frames, up the frame queue. Before the checks below: a read whose frames
  // were granted has host copies (filling) already.
  bool reading = false;
  bool promoted = false;
  for (uint32_t l = 0; l < layers; ++l) {
    if (!ops_.contains(PageKey{key, l, Tier::kHost})) continue;
    reading = true;
    if (prio == TransferPriority::kDemand && demand_host_op(key, l)) promoted = true;
  }
  if (promoted) promote_frame_waiters(Tier::kHost, key, prio);
  if (reading || nvme != CopyState::kReady || any_host) return;
  // Frames for every layer, granted one by one; the read starts when all are in hand.
  struct Gather {
    std::vector<uint32_t> frames;
    uint32_t granted = 0;
    bool failed = false;
  };
  auto g = std::make_shared<Gather>();
  g->frames.assign(layers, FrameAllocator::kNoFrame);
  for (uint32_t l = 0; l < layers; ++l) {
    auto op = std::make_unique<PageOp>();
    op->prefetch = prio != TransferPriority::kDemand;
    ops_.emplace(PageKey{key, l, Tier::kHost}, std::move(op));
  }
  auto fail_all = [this, key, layers](const Status& why) {
    for (uint32_t l = 0; l < layers; ++l) finish_op(PageKey{key, l, Tier::kHost}, why);
  };
  for (uint32_t l = 0; l < layers; ++l) {
    request_frame(
        Tier::kHost, key, l, prio,
        [this, key, l, layers, prio, g, fail_all](Result<uint32_t> frame) {
          if (!frame.ok()) {
            if (!g->failed) {
              g->failed = true;
            }
            g->granted += 1;
            if (g->granted == layers) {
              for (uint32_t j = 0; j < layers; ++j) {
                if (g->frames[j] != FrameAllocator::kNoFrame) {
                  parts_.table->abort_fill(key, CopyId::host(j)).ignore();
                }
              }
              fail_all(frame.status());
              serve_frame_waiters(Tier::kHost);
            }
            return;
          }
          g->frames[l] = *frame;
          g->granted += 1;
          if (g->granted < layers) return;
          if (g->failed) {
            for (uint32_t j = 0; j < layers; ++j) {
              if (g->frames[j] != FrameAllocator::kNoFrame) {
                parts_.table->abort_fill(key, CopyId::host(j)).ignore();
              }
            }
            fail_all(resource_exhausted("no host frames for block " + to_string(key)));
            serve_frame_waiters(Tier::kHost);
            return;
          }
          reading_[key] += 1;
          // Queued at the priority the read had when its frames were asked for, or demand if a
          // step joined it meanwhile; each layer's op names the job, so a later demand promotes it.
          bool demanded = false;
          for (uint32_t j = 0; j < layers; ++j) {
            auto it = ops_.find(PageKey{key, j, Tier::kHost});
            demanded |= it != ops_.end() && !it->second->prefetch;
          }
          const JobId job = links_.enqueue(
              Link::kNvmeToHost, demanded ? TransferPriority::kDemand : prio, nvme_block_bytes(),
              [this, key, layers, g, fail_all](std::function<void()> finished) {
                auto on_done = [this, key, layers, g, fail_all, finished](const Status& s) {
                  finished();
                  if (--reading_[key] == 0) reading_.erase(key);
                  for (uint32_t j = 0; j < layers; ++j) {
                    if (s.ok()) {
                      parts_.table->complete_fill(key, CopyId::host(j)).ignore();
                    } else {
                      parts_.table->abort_fill(key, CopyId::host(j)).ignore();
                    }
                  }
                  if (s.ok()) {
                    stats_.promotions[tier_index(Tier::kHost)].fetch_add(layers,
                                                                         std::memory_order_relaxed);
                    sync_membership(key, Tier::kHost);
                    for (uint32_t j = 0; j < layers; ++j) {
                      finish_op(PageKey{key, j, Tier::kHost}, ok_status());
                    }
                  } else {
                    stats_.failed_loads.fetch_add(1, std::memory_order_relaxed);
                    drop_nvme_copy(key);
                    fail_all(s.with_context("loading block " + to_string(key) + " from nvme"));
                    after_change(key);
                  }
                  serve_memory_waiters();  // the block read is a victim again
                };
                Status submitted = parts_.port->read_block(key, g->frames, on_done);
                if (!submitted.ok()) on_done(submitted);
              });
          for (uint32_t j = 0; j < layers; ++j) {
            if (auto it = ops_.find(PageKey{key, j, Tier::kHost}); it != ops_.end()) {
              it->second->job = job;
            }
          }
        });
  }
}

void Scheduler::prefetch_block(const BlockKey& key, bool into_hbm) {
  ensure_block_in_host(key, TransferPriority::kPrefetch);
  if (!into_hbm) return;
  // Into HBM only while it has free frames: a prefetch never evicts for itself.
  const uint32_t layers = options_.geometry.layers;
  for (uint32_t l = 0; l < layers; ++l) {
    if (parts_.hbm->free_count() <= layers) return;
    const PageSnapshot p = page_snapshot(key, l);
    if (!p.found || p.hbm != CopyState::kAbsent) continue;
    ensure_in_hbm(key, l, TransferPriority::kPrefetch, nullptr,
                  [](const Status& s) { s.ignore(); });
  }
}

// ---------------------------------------------------------------------------------------------
// Demotions and evictions
// ---------------------------------------------------------------------------------------------

bool Scheduler::may_lose_last_copy(const BlockKey& key, Tier tier) const {
  // Blocks of open sequences (and private blocks) must keep every page somewhere.
  bool in_use = key.is_private();
  bool loses = false;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    in_use = in_use || v.refcount() > 0;
    if (v.state(CopyId::nvme()) == CopyState::kReady && tier != Tier::kNvme) return;
    for (uint32_t l = 0; l < v.layers() && !loses; ++l) {
      const CopyState h = v.state(CopyId::hbm(l));
      const CopyState m = v.state(CopyId::host(l));
      const bool hbm_ok = h == CopyState::kReady && tier != Tier::kHbm;
      const bool host_ok = m == CopyState::kReady && tier != Tier::kHost;
      const bool here = (tier == Tier::kHbm    ? h
                         : tier == Tier::kHost ? m
                                               : CopyState::kAbsent) == CopyState::kReady;
      if (tier == Tier::kNvme) {
        loses = !(h == CopyState::kReady || m == CopyState::kReady);
      } else if (here && !hbm_ok && !host_ok) {
        loses = true;
      }
    }
  });
  s.ignore();
  return in_use && loses;
}

void Scheduler::refused_by_tier(const BlockKey& key, Tier tier, const Status& why) {
  refused_[key] |= static_cast<uint8_t>(1u << tier_index(tier));
  stats_.refused_demotions.fetch_add(1, std::memory_order_relaxed);
  log_once(LogLevel::kWarn, std::string("scheduler.refused.") + std::string(tier_name(tier)),
           std::string("the ") + std::string(tier_name(tier)) + " tier could not store block " +
               to_string(key) + " (" + why.to_string() +
               "); such blocks are dropped when nothing needs them, never sent there again");
  // The copies that would have gone down leave the tier above once nothing needs them.
  const Tier above = tier == Tier::kHost ? Tier::kHbm : Tier::kHost;
  if (!may_lose_last_copy(key, above)) {
    for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
      const PageSnapshot p = page_snapshot(key, l);
      const CopyState state = above == Tier::kHbm ? p.hbm : p.host;
      if (state != CopyState::kReady || (above == Tier::kHbm && p.pins != 0)) continue;
      if (parts_.table->drop(key, CopyId::page(above, l)).ok()) {
        stats_.evictions[tier_index(above)].fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  after_change(key);
}

bool Scheduler::shadowed_in(const BlockKey& key, Tier tier) const {
  bool shadowed = false;
  parts_.table->visit(key, [&](const EntryView& v) { shadowed = v.shadowed(tier); }).ignore();
  return shadowed;
}

void Scheduler::drop_nvme_copy(const BlockKey& key) {
  const PageSnapshot p = page_snapshot(key, 0);
  if (p.nvme != CopyState::kReady) return;
  parts_.port->erase_block(key).ignore();
  parts_.table->drop(key, CopyId::nvme()).ignore();
  sync_membership(key, Tier::kNvme);
}

uint64_t Scheduler::execute_move(const PlannedMove& move, TransferPriority prio) {
  const BlockKey key = move.block.key;
  const uint32_t layers = options_.geometry.layers;
  if (SkipFilter{this, move.from}(key)) return 0;
  // Frames of `from` given back now, or draining towards it.
  const uint64_t before =
      (move.from == Tier::kNvme ? (parts_.nvme != nullptr ? parts_.nvme->free_count() : 0)
                                : frames(move.from)->free_count()) +
      draining_[tier_index(move.from)];
  switch (move.from) {
    case Tier::kHbm: {
      const bool must_keep = may_lose_last_copy(key, Tier::kHbm);
      // A block the host tier refused is dropped rather than demoted (when it may be).
      const bool demote = move.to.has_value() && !refused(key, Tier::kHost);
      for (uint32_t l = 0; l < layers; ++l) {
        const PageSnapshot p = page_snapshot(key, l);
        if (p.hbm != CopyState::kReady || p.pins != 0) continue;
        if (p.host == CopyState::kReady || (!must_keep && !demote)) {
          if (parts_.table->drop(key, CopyId::hbm(l)).ok()) {
            stats_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
          }
        } else if (demote && p.host == CopyState::kAbsent && parts_.host->capacity() > 0) {
          demote_page_to_host(key, l, prio);
        }
      }
      break;
    }
    case Tier::kHost: {
      const bool must_keep = may_lose_last_copy(key, Tier::kHost);
      bool all_host_ready = true;
      for (uint32_t l = 0; l < layers && all_host_ready; ++l) {
        all_host_ready = page_snapshot(key, l).host == CopyState::kReady;
      }
      const PageSnapshot p0 = page_snapshot(key, 0);
      // The NVMe store is addressed by content key: a private block (no identity yet) stays in
      // memory until it is published.
      const bool to_nvme =
          !key.is_private() && parts_.nvme != nullptr && !refused(key, Tier::kNvme);
      if (to_nvme && p0.nvme != CopyState::kReady && all_host_ready &&
          (move.to == Tier::kNvme || must_keep) &&
          demote_block_to_nvme(key, prio, /*keep_host=*/false)) {
        break;
      }
      // Not written down (NVMe full of blocks in use, or refused): a cached block is dropped.
      if (to_nvme && must_keep && p0.nvme == CopyState::kAbsent && !all_host_ready &&
          !refused(key, Tier::kHost)) {
        // In use and split between HBM and host: its host pages can only leave through NVMe.
        stage_to_nvme(key, prio);
        break;
      }
      for (uint32_t l = 0; l < layers; ++l) {
        const PageSnapshot p = page_snapshot(key, l);
        if (p.host != CopyState::kReady) continue;
        const bool safe = p.hbm == CopyState::kReady || p.nvme == CopyState::kReady;
        if (safe || !must_keep) {
          if (parts_.table->drop(key, CopyId::host(l)).ok()) {
            stats_.evictions[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
            if (move.shadowed && p.hbm == CopyState::kReady) {
              stats_.shadowed_evictions[tier_index(Tier::kHost)].fetch_add(
                  1, std::memory_order_relaxed);
            }
          }
        }
      }
      break;
    }
    case Tier::kNvme:
      if (!may_lose_last_copy(key, Tier::kNvme)) {
        const PageSnapshot p = page_snapshot(key, 0);
        if (p.nvme == CopyState::kReady) {
          const bool shadowed = move.shadowed && shadowed_in(key, Tier::kNvme);
          drop_nvme_copy(key);
          stats_.evictions[tier_index(Tier::kNvme)].fetch_add(1, std::memory_order_relaxed);
          if (shadowed) {
            stats_.shadowed_evictions[tier_index(Tier::kNvme)].fetch_add(1,
                                                                         std::memory_order_relaxed);
          }
        }
      }
      break;
  }
  after_change(key);
  const uint64_t after =
      (move.from == Tier::kNvme ? (parts_.nvme != nullptr ? parts_.nvme->free_count() : 0)
                                : frames(move.from)->free_count()) +
      draining_[tier_index(move.from)];
  return after > before ? after - before : 0;
}

void Scheduler::demote_page_to_host(const BlockKey& key, uint32_t layer, TransferPriority prio) {
  const PageKey pk{key, layer, Tier::kHbm};
  if (ops_.contains(pk)) return;
  if (!parts_.table->begin_drain(key, CopyId::hbm(layer)).ok()) return;
  draining_[tier_index(Tier::kHbm)] += 1;
  auto op = std::make_unique<PageOp>();
  op->drain = true;
  ops_.emplace(pk, std::move(op));
  const auto undo = [this, key, layer, pk](const Status& why) {
    parts_.table->cancel_drain(key, CopyId::hbm(layer)).ignore();
    draining_[tier_index(Tier::kHbm)] -= 1;
    finish_op(pk, why);
  };
  request_frame(
      Tier::kHost, key, layer, prio, [this, key, layer, pk, prio, undo](Result<uint32_t> frame) {
        if (!frame.ok()) {
          undo(frame.status());
          return;
        }
        const uint32_t host_frame = *frame;
        const PageSnapshot p = page_snapshot(key, layer);
        links_.enqueue(
            Link::kHbmToHost, prio, parts_.port->host_page_bytes(),
            [this, key, layer, pk, host_frame, hbm_frame = p.hbm_frame,
             undo](std::function<void()> finished) {
              const FrameMove move{hbm_frame, host_frame};
              auto on_done = [this, key, layer, pk, finished, undo](const Status& s) {
                finished();
                if (s.ok()) {
                  parts_.table->complete_fill(key, CopyId::host(layer)).ignore();
                  parts_.table->complete_drain(key, CopyId::hbm(layer)).ignore();
                  draining_[tier_index(Tier::kHbm)] -= 1;
                  stats_.demotions[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
                  stats_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
                  sync_membership(key, Tier::kHost);
                  sync_membership(key, Tier::kHbm);
                  finish_op(pk, ok_status());
                  after_change(key);
                } else {
                  parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
                  undo(s);
                  if (s.code() == StatusCode::kInvalidArgument) {
                    // The host tier cannot hold this page (an fp8 host and a page with NaN or
                    // inf): the block stays in HBM while it is needed, and is dropped, never
                    // demoted again, once it is not.
                    refused_by_tier(key, Tier::kHost, s);
                  }
                }
                serve_frame_waiters(Tier::kHbm);
                serve_frame_waiters(Tier::kHost);
              };
              Status submitted =
                  parts_.port->copy_pages(Link::kHbmToHost, std::span(&move, 1), on_done);
              if (!submitted.ok()) on_done(submitted);
            });
      });
}

bool Scheduler::demote_block_to_nvme(const BlockKey& key, TransferPriority prio, bool keep_host) {
  const uint32_t layers = options_.geometry.layers;
  const PageKey pk{key, CopyId::kWholeBlock, Tier::kNvme};
  if (parts_.nvme == nullptr || key.is_private() || ops_.contains(pk)) return false;
  std::vector<uint32_t> host_frames(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    const PageSnapshot p = page_snapshot(key, l);
    if (p.host != CopyState::kReady) return false;
    host_frames[l] = p.host_frame;
  }
  auto extent = parts_.table->begin_fill(key, CopyId::nvme());
  if (!extent.ok() && extent.status().code() == StatusCode::kResourceExhausted) {
    // NVMe full: make room there (drops are immediate), then try once more.
    std::array<uint64_t, kNumTiers> free{};
    free[tier_index(Tier::kNvme)] = parts_.nvme->free_count();
    const SkipFilter skip{this, Tier::kNvme};
    const PlacementPlan plan = placement_->plan_room(Tier::kNvme, 1, free, KeyFilter(skip));
    for (const PlannedMove& m : plan.moves) execute_move(m, prio);
    extent = parts_.table->begin_fill(key, CopyId::nvme());
  }
  if (!extent.ok()) {
    extent.status().ignore();
    return false;
  }
  if (!keep_host) {
    for (uint32_t l = 0; l < layers; ++l) {
      parts_.table->begin_drain(key, CopyId::host(l)).ignore();
      auto drain = std::make_unique<PageOp>();
      drain->drain = true;
      ops_.emplace(PageKey{key, l, Tier::kHost}, std::move(drain));
    }
    draining_[tier_index(Tier::kHost)] += layers;
  } else {
    reading_[key] += 1;
  }
  ops_.emplace(pk, std::make_unique<PageOp>());
  links_.enqueue(
      Link::kHostToNvme, prio, nvme_block_bytes(),
      [this, key, layers, pk, keep_host, host_frames](std::function<void()> finished) {
        auto on_done = [this, key, layers, pk, keep_host, finished](const Status& written) {
          finished();
          // kAlreadyExists: the store holds this block readable already (keys name
          // content), so the block is on NVMe as if this write had stored it.
          const Status s = written.code() == StatusCode::kAlreadyExists ? ok_status() : written;
          if (s.ok()) {
            parts_.table->complete_fill(key, CopyId::nvme()).ignore();
            stats_.demotions[tier_index(Tier::kNvme)].fetch_add(1, std::memory_order_relaxed);
          } else {
            parts_.table->abort_fill(key, CopyId::nvme()).ignore();
          }
          if (!keep_host) {
            for (uint32_t l = 0; l < layers; ++l) {
              if (s.ok()) {
                parts_.table->complete_drain(key, CopyId::host(l)).ignore();
              } else {
                parts_.table->cancel_drain(key, CopyId::host(l)).ignore();
              }
            }
            draining_[tier_index(Tier::kHost)] -= layers;
            if (s.ok()) {
              stats_.evictions[tier_index(Tier::kHost)].fetch_add(layers,
                                                                  std::memory_order_relaxed);
            }
            for (uint32_t l = 0; l < layers; ++l) finish_op(PageKey{key, l, Tier::kHost}, s);
          } else if (--reading_[key] == 0) {
            reading_.erase(key);
          }
          sync_membership(key, Tier::kNvme);
          sync_membership(key, Tier::kHost);
          finish_op(pk, s);
          // The store refused the block (an fp8 store and a page with NaN or inf) or
          // could not write it (an I/O error): it is not written again — a failing disk
          // would otherwise be hammered with the same block, at once when the failure
          // comes from the submit call — and its host pages go when nothing needs them,
          // as any victim's that cannot go down.
          if (!s.ok() && s.code() != StatusCode::kCancelled) {
            refused_by_tier(key, Tier::kNvme, s);
          }
          after_change(key);
          serve_memory_waiters();  // the block read is a victim again
        };
        Status submitted = parts_.port->write_block(key, host_frames, on_done);
        if (!submitted.ok()) on_done(submitted);
      });
  return true;
}

void Scheduler::stage_to_nvme(const BlockKey& key, TransferPriority prio) {
  if (staging_.contains(key) || ops_.contains(PageKey{key, CopyId::kWholeBlock, Tier::kNvme})) {
    return;
  }
  const uint32_t layers = options_.geometry.layers;
  std::vector<uint32_t> to_stage;
  for (uint32_t l = 0; l < layers; ++l) {
    const PageSnapshot p = page_snapshot(key, l);
    if (p.host == CopyState::kReady) continue;
    if (p.host != CopyState::kAbsent || p.hbm != CopyState::kReady) return;  // in flight: later
    to_stage.push_back(l);
  }
  if (to_stage.empty()) return;
  staging_.insert(key);
  reading_[key] += 1;  // no other plan takes this block while it is staged
  struct Staging {
    uint32_t remaining = 0;
    bool failed = false;
  };
  auto st = std::make_shared<Staging>();
  st->remaining = static_cast<uint32_t>(to_stage.size());
  const auto one_done = [this, key, prio, st](bool ok) {
    st->failed = st->failed || !ok;
    if (--st->remaining != 0) return;
    staging_.erase(key);
    if (--reading_[key] == 0) reading_.erase(key);
    if (!st->failed) demote_block_to_nvme(key, prio, /*keep_host=*/false);
    serve_memory_waiters();  // the block read is a victim again
  };
  for (uint32_t l : to_stage) {
    auto pinned = parts_.table->pin(key, l);  // the HBM page is read by the copy below
    if (!pinned.ok()) {
      one_done(false);
      continue;
    }
    const uint32_t hbm_frame = *pinned;
    request_reserved_host_frame(key, l,
                                [this, key, l, hbm_frame, prio, one_done](Result<uint32_t> frame) {
                                  if (!frame.ok()) {
                                    parts_.table->unpin(key, l).ignore();
                                    one_done(false);
                                    return;
                                  }
                                  copy_pinned_page_down(key, l, hbm_frame, *frame, prio, one_done);
                                });
  }
}

void Scheduler::copy_pinned_page_down(const BlockKey& key, uint32_t layer, uint32_t hbm_frame,
                                      uint32_t host_frame, TransferPriority prio,
                                      std::function<void(bool)> done) {
  links_.enqueue(
      Link::kHbmToHost, prio, parts_.port->host_page_bytes(),
      [this, key, layer, hbm_frame, host_frame, done](std::function<void()> finished) {
        const FrameMove move{hbm_frame, host_frame};
        auto on_done = [this, key, layer, finished, done](const Status& s) {
          finished();
          parts_.table->unpin(key, layer).ignore();
          if (s.ok()) {
            parts_.table->complete_fill(key, CopyId::host(layer)).ignore();
            stats_.demotions[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
          } else {
            parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
            if (s.code() == StatusCode::kInvalidArgument) refused_by_tier(key, Tier::kHost, s);
          }
          done(s.ok());
        };
        Status submitted = parts_.port->copy_pages(Link::kHbmToHost, std::span(&move, 1), on_done);
        if (!submitted.ok()) on_done(submitted);
      });
}

void Scheduler::write_through(const BlockKey& key, TierMask tiers) {
  // Copy every HBM page down (the HBM copy stays); continue to NVMe, which is written from host
  // memory, once every page has a host copy. A page is pinned only once its host frame is granted,
  // for the copy itself: pinned while it waited (at write-back priority, behind every load) it
  // would hold an HBM frame that no plan can free and that begin_step does not count. Left
  // unpinned, it may be demoted meanwhile, which copies it down anyway; a page being demoted
  // (draining from HBM, now or when its frame is granted) is waited for, since the demotion's op
  // ends once its host copy is complete.
  const bool to_host =
      tiers.has(Tier::kHost) && parts_.host->capacity() > 0 && !refused(key, Tier::kHost);
  const bool then_nvme = tiers.has(Tier::kNvme);
  if (!to_host && !then_nvme) return;
  auto remaining = std::make_shared<uint32_t>(1);  // the loop's own share, given up at its end
  const auto last = [this, key, remaining, then_nvme] {
    if (--*remaining == 0 && then_nvme) {
      demote_block_to_nvme(key, TransferPriority::kWriteBack, true);
    }
  };
  const auto after_hbm_op = [this, key, last](uint32_t l) {
    attach(PageKey{key, l, Tier::kHbm}, [last](const Status&) { last(); });
  };
  for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
    const PageSnapshot p = page_snapshot(key, l);
    if (p.hbm == CopyState::kDraining) {
      ++*remaining;
      after_hbm_op(l);
      continue;
    }
    if (!to_host || p.hbm != CopyState::kReady || p.host != CopyState::kAbsent) continue;
    ++*remaining;
    request_frame(Tier::kHost, key, l, TransferPriority::kWriteBack,
                  [this, key, l, last, after_hbm_op](Result<uint32_t> frame) {
                    // Refused: the page's host copy is on its way (demoted meanwhile) or there, or
                    // the block is gone.
                    if (!frame.ok()) {
                      after_hbm_op(l);
                      return;
                    }
                    // Granted, but the HBM copy is leaving (being demoted) or gone: nothing to copy
                    // here.
                    const auto give_frame_back = [this, key, l, after_hbm_op] {
                      parts_.table->abort_fill(key, CopyId::host(l)).ignore();
                      after_hbm_op(l);
                      serve_frame_waiters(Tier::kHost);
                    };
                    if (page_snapshot(key, l).hbm != CopyState::kReady) {
                      give_frame_back();
                      return;
                    }
                    auto pinned = parts_.table->pin(key, l);
                    if (!pinned.ok()) {
                      give_frame_back();
                      return;
                    }
                    copy_pinned_page_down(key, l, *pinned, *frame, TransferPriority::kWriteBack,
                                          [this, key, last](bool copied) {
                                            if (copied) sync_membership(key, Tier::kHost);
                                            last();
                                            serve_frame_waiters(Tier::kHbm);
                                            serve_frame_waiters(Tier::kHost);
                                          });
                  });
  }
  last();
}

void Scheduler::check_watermarks() {
  for (Tier t : kAllTiers) {
    uint64_t capacity = 0;
    uint64_t used = 0;
    if (t == Tier::kNvme) {
      if (parts_.nvme == nullptr) continue;
      capacity = parts_.nvme->capacity();
      used = parts_.nvme->used();
    } else {
      capacity = frames(t)->capacity();
      used = frames(t)->used();
    }
    used = used > draining_[tier_index(t)] ? used - draining_[tier_index(t)] : 0;
    const uint64_t deficit =
        Placement::watermark_deficit(capacity, used, options_.watermarks[tier_index(t)]);
    if (deficit == 0) continue;
    std::array<uint64_t, kNumTiers> free{};
    for (Tier u : kAllTiers) {
      const uint64_t f = u == Tier::kNvme ? (parts_.nvme != nullptr ? parts_.nvme->free_count() : 0)
                                          : frames(u)->free_count();
      free[tier_index(u)] = f + draining_[tier_index(u)];
    }
    const SkipFilter skip{this, t};
    const PlacementPlan plan =
        placement_->plan_room(t, free[tier_index(t)] + deficit, free, KeyFilter(skip));
    for (const PlannedMove& move : plan.moves) execute_move(move, TransferPriority::kWriteBack);
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
    if (!failed_fills_.empty()) {
      for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
        failed_fills_.erase(PageKey{current, l, Tier::kHbm});
      }
    }
    current = parent;
  }
}

}  // namespace kvtier
