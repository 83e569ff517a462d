// Scheduler: promotions — a page brought up NVMe -> host -> HBM for a demand or a prefetch, joining
// what is already in flight, and the frames it waits for. See scheduler.hpp for the rules.
#include <algorithm>
#include <string>

#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

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
      // Leaving for host memory: wait until the copy there is complete, then load it back — or,
      // for a demand, when the demotion still waits for its host frame, withdraw it: the page is
      // ready again as soon as the demotion's op ends, which runs this waiter.
      attach(pk, [this, key, layer, prio, on_filling = std::move(on_filling),
                  done = std::move(done)](const Status&) mutable {
        ensure_in_hbm(key, layer, prio, std::move(on_filling), std::move(done));
      });
      if (prio == TransferPriority::kDemand) {
        withdraw_host_requests(&pk, Withdrawn::kDemotions, "a step reads the page");
      }
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

bool Scheduler::raise_host_op(const BlockKey& key, uint32_t layer, TransferPriority prio) {
  auto it = ops_.find(PageKey{key, layer, Tier::kHost});
  if (it == ops_.end() || !it->second->prefetch) return false;
  PageOp& op = *it->second;
  if (prio == TransferPriority::kDemand) op.prefetch = false;
  if (prio == TransferPriority::kAdmitted) op.admitted = true;
  if (op.job != 0) links_.promote(op.job, prio);
  return true;
}

void Scheduler::demand_host_read(const BlockKey& key, uint32_t layer) {
  // A whole-block read starts once every layer has its frame: all of the block's requests move.
  if (raise_host_op(key, layer, TransferPriority::kDemand)) {
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

std::vector<Scheduler::PageKey> Scheduler::host_pages_of(const BlockKey& key) const {
  std::vector<PageKey> pages;
  pages.reserve(options_.geometry.layers);
  for (uint32_t l = 0; l < options_.geometry.layers; ++l) pages.push_back({key, l, Tier::kHost});
  return pages;
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
    if (lost_blocks_.contains(key)) {
      // The read of its block failed with no other copy left: the step fails as that read did,
      // and the sequence recomputes the block at its next step (recompute_lost_blocks).
      done(io_error("page " + to_string(key) + " layer " + std::to_string(layer) +
                    " was lost: a read of its block from NVMe failed and no other copy is left"));
    } else {
      done(not_found("page " + to_string(key) + " layer " + std::to_string(layer) +
                     " has no copy in host memory or on nvme"));
    }
    return;
  }
  if (prio == TransferPriority::kPrefetch && !nvme_readable()) {
    // Speculative (a pinned prefix, the next step's first layers): a step that needs the page
    // reads it at demand.
    done(unavailable("page " + to_string(key) + " layer " + std::to_string(layer) +
                     " is on NVMe only, and reads from NVMe are paused after failing"));
    return;
  }
  auto op = std::make_unique<PageOp>();
  op->prefetch = prio != TransferPriority::kDemand;
  op->waiters.push_back(std::move(done));
  ops_.emplace(pk, std::move(op));
  request_frame(
      Tier::kHost, key, layer, prio,
      [this, key, layer, prio, pk](Result<uint32_t> frame) {
        if (!frame.ok()) {
          finish_op(pk, frame.status());
          return;
        }
        const uint32_t host_frame = *frame;
        reading_[key] += 1;  // the NVMe extent is read: keep it
        const JobId job = links_.enqueue(
            Link::kNvmeToHost, prio, parts_.port->nvme_page_bytes(),
            [this, key, layer, pk, host_frame](std::function<void()> finished) {
              if (skip_paused_prefetch(key, layer, 1, finished)) return;
              auto read = std::make_shared<FailedRead>();
              auto on_done = [this, key, layer, pk, finished, read](const Status& s) {
                note_nvme_read(s);  // first: a pause it starts holds back the reads queued
                finished();
                if (--reading_[key] == 0) reading_.erase(key);
                if (s.ok()) {
                  Status c = parts_.table->complete_fill(key, CopyId::host(layer));
                  stats_.promotions[tier_index(Tier::kHost)].fetch_add(1,
                                                                       std::memory_order_relaxed);
                  sync_membership(key, Tier::kHost);
                  finish_op(pk, c);
                } else {
                  stats_.failed_loads.fetch_add(1, std::memory_order_relaxed);
                  hold_read_frames(*read, key, layer, 1);
                  // A block whose read failed (I/O error, checksum) is never served again;
                  // erased after a media error, its extent is retired in the store.
                  drop_nvme_copy(key);
                  finish_op(pk, s.with_context("loading " + to_string(key) + " layer " +
                                               std::to_string(layer) + " from nvme"));
                  note_if_lost(key);
                  after_change(key);
                  take_retired_nvme_extents();
                }
                // A dead drive took the block while it was read: forgotten now.
                if (!lost_nvme_later_.empty()) forget_lost_nvme_blocks();
                serve_memory_waiters();  // the block read is a victim again
              };
              auto released = [this, read] { release_read_frames(*read); };
              Status submitted = parts_.port->read_page(key, layer, host_frame, on_done, released);
              if (!submitted.ok()) {
                on_done(nvme_read_not_started(key, submitted));
                released();
              }
            });
        if (auto again = ops_.find(pk); again != ops_.end()) again->second->job = job;
      },
      FrameUse::kNvmeRead);
}

bool Scheduler::skip_paused_prefetch(const BlockKey& key, uint32_t first_layer, uint32_t count,
                                     const std::function<void()>& finished) {
  if (nvme_readable()) return false;  // the common case
  std::vector<PageKey> pages;
  for (uint32_t l = first_layer; l < first_layer + count; ++l) {
    auto it = ops_.find(PageKey{key, l, Tier::kHost});
    if (it == ops_.end() || !it->second->prefetch || it->second->admitted) return false;
    pages.push_back(it->first);
  }
  finished();
  if (--reading_[key] == 0) reading_.erase(key);
  for (uint32_t l = first_layer; l < first_layer + count; ++l) {
    parts_.table->abort_fill(key, CopyId::host(l)).ignore();
  }
  finish_ops(pages, cancelled("prefetch of " + to_string(key) +
                              " from nvme not started: reads from NVMe are paused"));
  after_change(key);
  serve_memory_waiters();  // its frames are free, and the block a victim again
  return true;
}

void Scheduler::hold_read_frames(FailedRead& read, const BlockKey& key, uint32_t first_layer,
                                 uint32_t count) {
  for (uint32_t l = first_layer; l < first_layer + count; ++l) {
    Result<uint32_t> frame = parts_.table->abandon_fill(key, CopyId::host(l));
    if (frame.ok()) read.frames.push_back(*frame);
  }
  stats_.host_frames_held.fetch_add(read.frames.size(), std::memory_order_relaxed);
}

void Scheduler::release_read_frames(FailedRead& read) {
  if (read.frames.empty()) return;  // no copy was given up (it was gone already)
  for (uint32_t frame : read.frames) {
    parts_.table->release_held_frame(Tier::kHost, frame).ignore();
  }
  stats_.host_frames_held.fetch_sub(read.frames.size(), std::memory_order_relaxed);
  read.frames.clear();
  serve_memory_waiters();
}

Status Scheduler::nvme_read_not_started(const BlockKey& key, const Status& why) {
  // A read waits for its host frames and its turn on the link: meanwhile another read of the
  // block may have failed, and its NVMe copy gone with it (a block whose read failed is never
  // read again), or a block no sequence holds been evicted, or a dead drive taken it (the store
  // lists it; forgotten here). That is no misuse the store's not_found would suggest: the page is
  // not there any more, and a sequence that held it recomputes it (lost_blocks_).
  forget_lost_nvme_blocks();
  const bool lost_with_a_drive =
      std::find(lost_nvme_later_.begin(), lost_nvme_later_.end(), key) != lost_nvme_later_.end();
  if (!lost_with_a_drive && page_snapshot(key, 0).nvme == CopyState::kReady) return why;
  return unavailable("block " + to_string(key) +
                     " left NVMe before this read of it started (a read of it failed, it was "
                     "evicted, or its drive was taken out of service): " +
                     why.to_string());
}

void Scheduler::ensure_block_in_host(const BlockKey& key, TransferPriority prio, bool hinted) {
  // One large read when the block is on NVMe only (DESIGN.md: a whole-block read is one I/O),
  // and none when every page is ready in HBM, where the step reads it: a block that host memory
  // merely lacks (written through to NVMe, its host copies dropped) was read up again at demand
  // priority, 1 TB of NVMe reads in the trace at 3x, taking the link and host frames from the
  // loads steps waited for.
  const uint32_t layers = options_.geometry.layers;
  bool any_host = false;
  bool in_hbm = false;
  CopyState nvme = CopyState::kAbsent;
  Status s = parts_.table->visit(key, [&](const EntryView& v) {
    nvme = v.state(CopyId::nvme());
    any_host = v.copies(Tier::kHost) > 0;
    in_hbm = v.hbm_ready_pages() == layers;
  });
  if (!s.ok() || in_hbm) return;
  // A prefetch, the lowest priority a read takes, finds nothing to start or to move up when the
  // block is in host memory or has no NVMe copy to read (a hint passes here for every block of
  // its prefixes, each time), or when reads from NVMe are paused.
  if (prio == TransferPriority::kPrefetch &&
      (any_host || nvme != CopyState::kReady || !nvme_readable())) {
    return;
  }
  // A demand, or a sequence just opened, joins a read issued at a lower priority: the read moves
  // up its link's queue, or, still waiting for host frames, up the frame queue. Before the checks
  // below: a read whose frames were granted has host copies (filling) already.
  bool reading = false;
  bool promoted = false;
  for (uint32_t l = 0; l < layers; ++l) {
    if (!ops_.contains(PageKey{key, l, Tier::kHost})) continue;
    reading = true;
    if (prio != TransferPriority::kPrefetch && raise_host_op(key, l, prio)) promoted = true;
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
    op->admitted = prio == TransferPriority::kAdmitted;
    op->hinted = hinted;
    ops_.emplace(PageKey{key, l, Tier::kHost}, std::move(op));
  }
  auto fail_all = [this, key](const Status& why) { finish_ops(host_pages_of(key), why); };
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
          // Queued at the priority the read had when its frames were asked for, or higher if a
          // step (demand) or a sequence just opened (admitted) joined it meanwhile; each layer's
          // op names the job, so a later one promotes it.
          TransferPriority queue_at = prio;
          for (uint32_t j = 0; j < layers; ++j) {
            auto it = ops_.find(PageKey{key, j, Tier::kHost});
            if (it == ops_.end()) continue;
            if (!it->second->prefetch) {
              queue_at = TransferPriority::kDemand;
            } else if (it->second->admitted && queue_at != TransferPriority::kDemand) {
              queue_at = TransferPriority::kAdmitted;
            }
          }
          const JobId job = links_.enqueue(
              Link::kNvmeToHost, queue_at, nvme_block_bytes(),
              [this, key, layers, g, fail_all](std::function<void()> finished) {
                if (skip_paused_prefetch(key, 0, layers, finished)) return;
                auto read = std::make_shared<FailedRead>();
                auto on_done = [this, key, layers, fail_all, finished, read](const Status& s) {
                  note_nvme_read(s);  // first: a pause it starts holds back the reads queued
                  finished();
                  if (--reading_[key] == 0) reading_.erase(key);
                  if (s.ok()) {
                    for (uint32_t j = 0; j < layers; ++j) {
                      parts_.table->complete_fill(key, CopyId::host(j)).ignore();
                    }
                  } else {
                    hold_read_frames(*read, key, 0, layers);
                  }
                  if (s.ok()) {
                    stats_.promotions[tier_index(Tier::kHost)].fetch_add(layers,
                                                                         std::memory_order_relaxed);
                    sync_membership(key, Tier::kHost);
                    finish_ops(host_pages_of(key), ok_status());
                  } else {
                    stats_.failed_loads.fetch_add(1, std::memory_order_relaxed);
                    drop_nvme_copy(key);
                    fail_all(s.with_context("loading block " + to_string(key) + " from nvme"));
                    note_if_lost(key);
                    after_change(key);
                    take_retired_nvme_extents();
                  }
                  // A dead drive took the block while it was read: forgotten now.
                  if (!lost_nvme_later_.empty()) forget_lost_nvme_blocks();
                  serve_memory_waiters();  // the block read is a victim again
                };
                auto released = [this, read] { release_read_frames(*read); };
                Status submitted = parts_.port->read_block(key, g->frames, on_done, released);
                if (!submitted.ok()) {
                  on_done(nvme_read_not_started(key, submitted));
                  released();
                }
              });
          for (uint32_t j = 0; j < layers; ++j) {
            if (auto it = ops_.find(PageKey{key, j, Tier::kHost}); it != ops_.end()) {
              it->second->job = job;
            }
          }
        },
        FrameUse::kNvmeRead);
  }
}

bool Scheduler::prefetch_block(const BlockKey& key, PrefetchFor whom, bool into_hbm) {
  const bool hinted = whom == PrefetchFor::kWaitingRequest;
  // A sequence just opened reads its blocks from NVMe ahead of the reads for requests still
  // waiting, which start later: its first step comes next.
  ensure_block_in_host(key, hinted ? TransferPriority::kPrefetch : TransferPriority::kAdmitted,
                       hinted);
  return into_hbm && prefetch_into_hbm(key, whom);
}

bool Scheduler::prefetch_into_hbm(const BlockKey& key, PrefetchFor whom) {
  const bool hinted = whom == PrefetchFor::kWaitingRequest;
  // Into HBM only while it has free frames: a prefetch never evicts for itself. For a request
  // still waiting, only below HBM's low watermark: the frames above it, which watermark demotions
  // keep free, are for the sequences running (a waiting request's prefix took them, the demotion
  // that followed evicted as much again, and the next hint loaded back what of it had gone: the
  // docs workload moved 8.9 TB host->HBM instead of 1.6, a step stalled 21 % of its time, not 3).
  // Those limits are checked here, as the load is issued, so for a waiting request only pages
  // ready in host memory are loaded, which take their frames at once: a page still to be read
  // from NVMe would take its frame when the read arrives, past the checks (pages issued together
  // went past the watermark and, with no frame free, made room for themselves by evicting: at
  // the trace's recorded rate 1,671 blocks so loaded, a third never reused). The engine's next
  // hint loads it, if there is room then.
  const uint32_t layers = options_.geometry.layers;
  const FrameAllocator& hbm = *parts_.hbm;
  const uint64_t fill_to =
      whom == PrefetchFor::kOpenSequence
          ? hbm.capacity()
          : static_cast<uint64_t>(options_.watermarks[tier_index(Tier::kHbm)].low *
                                  static_cast<double>(hbm.capacity()));
  for (uint32_t l = 0; l < layers; ++l) {
    const uint64_t used = hbm.used();
    if (hbm.capacity() - used <= layers || used + layers > fill_to) return false;
    const PageSnapshot p = page_snapshot(key, l);
    if (!p.found || p.hbm != CopyState::kAbsent) continue;
    if (hinted && p.host != CopyState::kReady) continue;
    const PageKey page{key, l, Tier::kHbm};
    const bool was_loading = ops_.contains(page);
    ensure_in_hbm(key, l, TransferPriority::kPrefetch, nullptr,
                  [](const Status& s) { s.ignore(); });
    if (auto it = ops_.find(page); hinted && !was_loading && it != ops_.end()) {
      it->second->hinted = true;
    }
  }
  return true;
}

}  // namespace kvtier
