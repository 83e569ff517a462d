// Scheduler: demotions and evictions — planned moves carried out (HBM -> host -> NVMe, or dropped
// when another copy stays), write-through and the watermarks that start demotion before a tier is
// full. See scheduler.hpp for the rules.
#include <string>
#include <unordered_set>
#include <utility>

#include "kvtier/log.hpp"
#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

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
  const bool newly_kept =
      tier == Tier::kNvme && !refused(key, Tier::kNvme) && parts_.table->referenced(key);
  uint8_t bits = static_cast<uint8_t>(1u << tier_index(tier));
  if (tier == Tier::kNvme && is_disk_write_failure(why)) bits |= kRefusedByFailingDisk;
  refused_[key] |= bits;
  stats_.refused_demotions.fetch_add(1, std::memory_order_relaxed);
  log_once(LogLevel::kWarn, std::string("scheduler.refused.") + std::string(tier_name(tier)),
           std::string("the ") + std::string(tier_name(tier)) + " tier could not store block " +
               to_string(key) + " (" + why.to_string() +
               "); such blocks are dropped when nothing needs them, not sent there again (for a "
               "failing disk: until writes there succeed after a pause)");
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
  if (newly_kept) fail_steps_that_no_longer_fit(kept_in_memory_because(key, why));
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

bool Scheduler::lacks_a_page(const BlockKey& key) const {
  bool lacks = false;
  parts_.table
      ->visit(key,
              [&](const EntryView& v) {
                if (v.state(CopyId::nvme()) == CopyState::kReady) return;
                for (uint32_t l = 0; l < v.layers() && !lacks; ++l) {
                  lacks = v.state(CopyId::hbm(l)) == CopyState::kAbsent &&
                          v.state(CopyId::host(l)) == CopyState::kAbsent;
                }
              })
      .ignore();
  return lacks;
}

void Scheduler::note_if_lost(const BlockKey& key) {
  // Whether a page is lost is known only once the loads that waited on the read have given up
  // their fills, some of them later: a sequence checks when its next step begins.
  if (!parts_.table->referenced(key) || lost_blocks_.contains(key)) return;
  lost_blocks_.insert(key);
  fail_steps_that_no_longer_fit(kept_in_memory_because(
      key, io_error("a read of it from NVMe failed and it has no other copy of some page")));
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
      uint32_t down = 0;
      for (uint32_t i = 0; i < layers; ++i) {
        const uint32_t l = layers - 1 - i;  // highest first (PlannedMove::pages_down)
        const PageSnapshot p = page_snapshot(key, l);
        if (p.hbm != CopyState::kReady || p.pins != 0) continue;
        if (p.host == CopyState::kReady || (!must_keep && !demote)) {
          if (parts_.table->drop(key, CopyId::hbm(l)).ok()) {
            stats_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
          }
        } else if (demote && p.host == CopyState::kAbsent && parts_.host->capacity() > 0 &&
                   (move.pages_down == 0 || down < move.pages_down)) {
          demote_page_to_host(key, l, prio);
          ++down;
        }
      }
      // In use, with no NVMe copy, and host memory has no room for it now or later (not enough
      // free beyond the reserve for its pages, no transfer in flight that could change that):
      // its pages leave HBM by way of NVMe, staged through the frames host memory keeps for
      // that, and once written they are dropped like any page with a copy below. Only then:
      // staging takes the reserve and the NVMe link from everything else, and under load (the
      // Mooncake trace at its rate) doing it whenever a plan found no host room doubled the
      // mean TTFT. And only when NVMe has an extent for it, free or freed now: a block staged
      // but not written stays in host memory as a copy of pages HBM still holds, host memory
      // drops it first to refill its reserve, and HBM, no emptier, staged it again for ever.
      if (must_keep && !move.to.has_value() && nvme_takes(key) && !refused(key, Tier::kHost) &&
          links_.idle() && !host_takes_demotion_of(key) &&
          page_snapshot(key, 0).nvme == CopyState::kAbsent &&
          make_nvme_room(staging_.size() + 1, prio)) {
        stage_to_nvme(key, prio);
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
      // A private block (no content key yet) stays in memory until it is published.
      const bool to_nvme = nvme_takes(key);
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
    // The page is ready in HBM again: its tier's policy must see it, or no plan could ever
    // choose it (a withdrawn demotion left such pages out of HBM's victims for good).
    parts_.table->cancel_drain(key, CopyId::hbm(layer)).ignore();
    draining_[tier_index(Tier::kHbm)] -= 1;
    sync_membership(key, Tier::kHbm);
    finish_op(pk, why);
  };
  demotions_awaiting_host_ += 1;
  request_frame(
      Tier::kHost, key, layer, prio,
      [this, key, layer, pk, prio, undo](Result<uint32_t> frame) {
        demotions_awaiting_host_ -= 1;
        if (!frame.ok()) {
          undo(frame.status());
          return;
        }
        const uint32_t host_frame = *frame;
        const PageSnapshot p = page_snapshot(key, layer);
        auto on_done = [this, key, layer, pk, undo](const Status& s) {
          if (s.ok()) {
            parts_.table->complete_fill(key, CopyId::host(layer)).ignore();
            parts_.table->complete_drain(key, CopyId::hbm(layer)).ignore();
            draining_[tier_index(Tier::kHbm)] -= 1;
            stats_.demotions[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
            stats_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
            landed_.push_back(pk);  // the rest, once per block of the batch: land_demotions
            return;
          }
          parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
          undo(s);
          if (s.code() == StatusCode::kInvalidArgument) {
            // The host tier cannot hold this page (an fp8 host and a page with NaN or inf): the
            // block stays in HBM while it is needed, and is dropped, never demoted again, once
            // it is not.
            refused_by_tier(key, Tier::kHost, s);
          }
          // The frame waiters are served after the batch (land_demotions), as for pages that
          // landed.
        };
        batcher_.copy_page(Link::kHbmToHost, prio, FrameMove{p.hbm_frame, host_frame},
                           std::move(on_done));
      },
      FrameUse::kDemotion);
}

void Scheduler::land_demotions() {
  // What a landed page's demotion owes, done once per block of the batch: each block's policy
  // membership in both tiers before any page's waiters run, then the waiters, then the blocks'
  // bookkeeping (after_change), then the frame waiters HBM's freed frames and host's filled ones
  // may serve. Copies down of pinned pages (write-through, staging) likewise: the host policy
  // sees each block before the copies' callers are told. A completion of this batch's pages that
  // starts another batch finds landed_ and copied_down_ empty.
  const std::vector<PageKey> landed = std::exchange(landed_, {});
  std::vector<CopiedDown> copied = std::exchange(copied_down_, {});
  std::vector<BlockKey> blocks;  // in the order their first page landed
  std::unordered_set<BlockKey, BlockKeyHash> seen;
  for (const PageKey& pk : landed) {
    if (seen.insert(pk.key).second) blocks.push_back(pk.key);
  }
  std::vector<BlockKey> copied_blocks;  // those only copies down landed for
  for (const CopiedDown& c : copied) {
    if (c.ok && seen.insert(c.key).second) copied_blocks.push_back(c.key);
  }
  for (const BlockKey& key : blocks) {
    sync_membership(key, Tier::kHost);
    sync_membership(key, Tier::kHbm);
  }
  for (const BlockKey& key : copied_blocks) sync_membership(key, Tier::kHost);
  for (const PageKey& pk : landed) finish_op(pk, ok_status());
  for (CopiedDown& c : copied) c.done(c.ok);
  for (const BlockKey& key : blocks) after_change(key);
  serve_frame_waiters(Tier::kHbm);
  serve_frame_waiters(Tier::kHost);
}

std::size_t Scheduler::withdraw_host_requests(const PageKey* only, Withdrawn what,
                                              std::string_view why) {
  std::vector<FrameWaiter> demotions;
  std::vector<std::pair<FrameWaiter, bool>> reads;  // and whether a step's (demand) read
  auto& queues = waiters_[tier_index(Tier::kHost)];
  for (int p = 0; p < kNumPriorities; ++p) {
    const bool prefetch = static_cast<TransferPriority>(p) != TransferPriority::kDemand;
    auto& q = queues[p];
    for (auto it = q.begin(); it != q.end();) {
      const bool page = only == nullptr || (it->key == only->key && it->layer == only->layer);
      const bool demotion = it->use == FrameUse::kDemotion;
      const bool read = what == Withdrawn::kDemotionsAndReads && it->use == FrameUse::kNvmeRead;
      if (!page || !(demotion || read)) {
        ++it;
        continue;
      }
      if (demotion) {
        demotions.push_back(std::move(*it));
      } else {
        reads.emplace_back(std::move(*it), !prefetch);
      }
      it = q.erase(it);
    }
  }
  // Each request's own undo, out of the queues first (an undo may queue requests of its own): a
  // demotion's HBM copy is ready again, its op ends and whoever waited on it reads the page
  // afresh; a prefetch's read from NVMe ends unstarted (its HBM fill, if any, is given up), and a
  // step that wants the page later asks again, as a demand.
  for (FrameWaiter& w : demotions) {
    w.granted(cancelled("demotion of " + to_string(w.key) + " layer " + std::to_string(w.layer) +
                        " withdrawn: " + std::string(why)));
  }
  for (auto& [w, demand] : reads) {
    const std::string what_read =
        "of " + to_string(w.key) + " layer " + std::to_string(w.layer) + " from nvme withdrawn: ";
    // A prefetch ends unstarted; a step's read fails the step, which the engine may begin again.
    w.granted(demand ? unavailable("read " + what_read + std::string(why))
                     : cancelled("prefetch " + what_read + std::string(why)));
  }
  // The HBM room counted on the demoted pages is to be made otherwise.
  if (!demotions.empty()) parts_.loop->post([this] { serve_frame_waiters(Tier::kHbm); });
  return demotions.size() + reads.size();
}

bool Scheduler::demote_block_to_nvme(const BlockKey& key, TransferPriority prio, bool keep_host,
                                     bool drop_hbm) {
  const uint32_t layers = options_.geometry.layers;
  const PageKey pk{key, CopyId::kWholeBlock, Tier::kNvme};
  if (!nvme_writable() || key.is_private() || ops_.contains(pk)) return false;
  std::vector<uint32_t> host_frames(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    const PageSnapshot p = page_snapshot(key, l);
    if (p.host != CopyState::kReady) return false;
    host_frames[l] = p.host_frame;
  }
  auto extent = parts_.table->begin_fill(key, CopyId::nvme());
  if (!extent.ok() && extent.status().code() == StatusCode::kResourceExhausted &&
      make_nvme_room(1, prio)) {
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
    // Leaving host memory: its policy lets the block go now, not when the write ends (a block
    // staged from HBM just before was tracked there the moment its pages landed).
    sync_membership(key, Tier::kHost);
  } else {
    reading_[key] += 1;
  }
  ops_.emplace(pk, std::make_unique<PageOp>());
  links_.enqueue(
      Link::kHostToNvme, prio, nvme_block_bytes(),
      [this, key, layers, pk, prio, keep_host, drop_hbm,
       host_frames](std::function<void()> finished) {
        auto on_done = [this, key, layers, pk, prio, keep_host, drop_hbm,
                        finished](const Status& written) {
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
            finish_ops(host_pages_of(key), s);
          } else if (--reading_[key] == 0) {
            reading_.erase(key);
          }
          sync_membership(key, Tier::kNvme);
          sync_membership(key, Tier::kHost);
          finish_op(pk, s);
          // A disk that fails write after write pauses writing (first: a step that no longer
          // fits hears of the pause, the larger cause).
          note_nvme_write(s);
          // A write that failed on a bad sector retired its extent in the store: the next write
          // of the block lands elsewhere, so the block is not refused.
          const bool extent_retired = take_retired_nvme_extents() > 0;
          // The store refused the block (an fp8 store and a page with NaN or inf) or
          // could not write it (an I/O error): it is not written again — a failing disk
          // would otherwise be hammered with the same block, at once when the failure
          // comes from the submit call — and its host pages go when nothing needs them,
          // as any victim's that cannot go down.
          if (!s.ok() && s.code() != StatusCode::kCancelled && !extent_retired) {
            refused_by_tier(key, Tier::kNvme, s);
          }
          if (s.ok() && drop_hbm) {
            // The block was staged to free its HBM frames: they go now, while its NVMe copy is
            // there (a drop like any page's with a copy below). Left for a later plan, another
            // block's staging could take that extent first (NVMe full of blocks in use), the
            // pages would be last copies again, and two blocks in use were staged in turn for
            // ever while the step that needed the frames waited.
            PlannedMove drop;
            drop.block.key = key;
            drop.from = Tier::kHbm;
            drop.clean_below = true;
            execute_move(drop, prio);
          }
          after_change(key);
          serve_memory_waiters();  // the block read is a victim again
        };
        Status submitted = parts_.port->write_block(key, host_frames, on_done);
        if (!submitted.ok()) on_done(submitted);
      });
  return true;
}

bool Scheduler::make_nvme_room(uint64_t extents, TransferPriority prio) {
  if (parts_.nvme == nullptr) return false;
  std::array<uint64_t, kNumTiers> free{};
  free[tier_index(Tier::kNvme)] = parts_.nvme->free_count();
  if (free[tier_index(Tier::kNvme)] >= extents) return true;
  const SkipFilter skip{this, Tier::kNvme};
  const PlacementPlan plan = placement_->plan_room(Tier::kNvme, extents, free, KeyFilter(skip));
  for (const PlannedMove& m : plan.moves) execute_move(m, prio);
  return parts_.nvme->free_count() >= extents;
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
    // The staged pages are host memory's now, whether NVMe takes the block or not (full of
    // blocks in use): its policy must see them.
    sync_membership(key, Tier::kHost);
    if (!st->failed) demote_block_to_nvme(key, prio, /*keep_host=*/false, /*drop_hbm=*/true);
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
  auto on_done = [this, key, layer, done = std::move(done)](const Status& s) mutable {
    parts_.table->unpin(key, layer).ignore();
    if (s.ok()) {
      parts_.table->complete_fill(key, CopyId::host(layer)).ignore();
      stats_.demotions[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
    } else {
      parts_.table->abort_fill(key, CopyId::host(layer)).ignore();
      if (s.code() == StatusCode::kInvalidArgument) refused_by_tier(key, Tier::kHost, s);
    }
    copied_down_.push_back(CopiedDown{key, s.ok(), std::move(done)});  // land_demotions calls it
  };
  batcher_.copy_page(Link::kHbmToHost, prio, FrameMove{hbm_frame, host_frame}, std::move(on_done));
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
                                          [last](bool) { last(); });
                  });
  }
  last();
}

namespace {
// Planned moves one loop task carries out: a move demotes a block's pages (one per layer), so 8
// are a few hundred page copies, a couple of CopyBatcher batches, and a fraction of a millisecond
// on the loop for an engine call that waits behind them.
constexpr std::size_t kWatermarkMovesPerTurn = 8;
}  // namespace

void Scheduler::want_watermark_check() {
  if (watermark_stopped_) return;
  watermark_check_wanted_ = true;
  if (watermark_turn_posted_) return;
  watermark_turn_posted_ = true;
  parts_.loop->post([this] { run_watermark_turn(); });
}

void Scheduler::stop_watermark_checks() {
  watermark_stopped_ = true;
  watermark_check_wanted_ = false;
  watermark_next_tier_ = kNumTiers;
  watermark_moves_.clear();
}

void Scheduler::run_watermark_turn() {
  watermark_turn_posted_ = false;
  if (watermark_stopped_) return;
  std::size_t budget = kWatermarkMovesPerTurn;
  while (budget > 0) {
    if (!watermark_moves_.empty()) {
      const PlannedMove move = std::move(watermark_moves_.front());
      watermark_moves_.pop_front();
      execute_move(move, TransferPriority::kWriteBack);
      --budget;
      continue;
    }
    if (watermark_next_tier_ == kNumTiers) {
      if (!watermark_check_wanted_) break;
      watermark_check_wanted_ = false;
      watermark_next_tier_ = 0;
      give_back_pins_ahead();
    }
    std::vector<PlannedMove> plan = plan_watermark(kAllTiers[watermark_next_tier_++]);
    watermark_moves_.assign(std::make_move_iterator(plan.begin()),
                            std::make_move_iterator(plan.end()));
  }
  const bool more =
      !watermark_moves_.empty() || watermark_next_tier_ < kNumTiers || watermark_check_wanted_;
  if (more && !watermark_turn_posted_) {
    watermark_turn_posted_ = true;
    parts_.loop->post([this] { run_watermark_turn(); });
  }
}

std::vector<PlannedMove> Scheduler::plan_watermark(Tier tier) {
  uint64_t capacity = 0;
  uint64_t used = 0;
  if (tier == Tier::kNvme) {
    if (parts_.nvme == nullptr) return {};
    capacity = parts_.nvme->in_service();
    used = parts_.nvme->used();
  } else {
    capacity = frames(tier)->capacity();
    used = frames(tier)->used();
  }
  used = used > draining_[tier_index(tier)] ? used - draining_[tier_index(tier)] : 0;
  const uint64_t deficit =
      Placement::watermark_deficit(capacity, used, options_.watermarks[tier_index(tier)]);
  if (deficit == 0) return {};
  const std::array<uint64_t, kNumTiers> free = room_for_plans(tier);
  const SkipFilters skip(this);
  return placement_->plan_room(tier, free[tier_index(tier)] + deficit, free, skip.per_tier()).moves;
}

}  // namespace kvtier
