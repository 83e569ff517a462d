// Scheduler: the step contract after a step is admitted — per-layer planning and release,
// end_step, abort, waits. Admitting a batch (begin_step) is in scheduler_begin_step.cpp, publishing
// the blocks a step filled in scheduler_publish.cpp. See scheduler.hpp.
#include <algorithm>
#include <string>

#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

Result<std::shared_ptr<Scheduler::PublishedStep>> Scheduler::published(StepId id) const {
  std::lock_guard<std::mutex> lock(published_mu_);
  auto it = published_.find(id);
  if (it == published_.end()) {
    return not_found("step " + std::to_string(id) + " is not open (never begun, or ended)");
  }
  return it->second;
}

Result<Scheduler::Step*> Scheduler::find_step(StepId id) const {
  auto it = steps_.find(id);
  if (it == steps_.end()) {
    return not_found("step " + std::to_string(id) + " is not open (never begun, or ended)");
  }
  return it->second.get();
}

void Scheduler::pin_resident_blocks(Step& step, ResidentPins& r) {
  r.step = &step;
  for (const auto& blocks : step.blocks) {
    for (const BlockKey& key : blocks) {
      // A block the step creates or refills is written, never pinned here: the null key, which
      // names no block, leaves it to plan_layer.
      r.keys.push_back(step.new_blocks.contains(key) ? BlockKey{} : key);
    }
  }
  const std::size_t n = r.keys.size();
  r.pinned.assign(n, 0);
  r.frames_by_block.resize(n * step.layers);
  auto pinned = parts_.table->pin_blocks_ready(r.keys, r.frames_by_block, r.pinned, &r.entries);
  if (!pinned.ok()) {
    // Not expected (the spans are sized above): every page then takes plan_layer's path.
    r.pinned.assign(n, 0);
    return;
  }
  r.held = *pinned > 0;
  // plan_layer reads them a layer at a time: transposed in tiles of blocks whose frames stay in
  // the cache, each layer's run written in order (read a layer at a time from the block-major
  // frames, every read missed the cache: a third of a large decode step's time).
  constexpr std::size_t kTile = 64;
  const uint32_t layers = step.layers;
  r.frames.resize(n * layers);
  for (std::size_t first = 0; first < n; first += kTile) {
    const std::size_t last = std::min(n, first + kTile);
    for (uint32_t l = 0; l < layers; ++l) {
      for (std::size_t slot = first; slot < last; ++slot) {
        r.frames[l * n + slot] = r.frames_by_block[slot * layers + l];
      }
    }
  }
}

void Scheduler::give_back_pins_ahead() {
  if (pins_ahead_ == nullptr || !pins_ahead_->held) return;
  ResidentPins& r = *pins_ahead_;
  r.held = false;
  Step& step = *r.step;
  // Layer by layer, plan_layer had reached every page before (layer, slot): those become pins of
  // their own and go to the per-layer lists; the pages from there on are unpinned, as page by
  // page they were not pinned yet.
  std::vector<BlockKey> reached;  // pinned blocks whose page in `r.layer` was reached
  std::vector<BlockKey> ahead;
  for (std::size_t slot = 0; slot < r.keys.size(); ++slot) {
    if (r.pinned[slot]) (slot < r.slot ? reached : ahead).push_back(r.keys[slot]);
  }
  // A block whose page pins are at their most keeps its block pin to the end of the step (it
  // stays in HBM, and plan_layer pins its pages again as any other's). The keys left whole come
  // back in `keys`' order, so each is matched to its own listing (a block two sequences of the
  // batch read is listed, and pinned, twice).
  std::vector<BlockKey> whole;
  const auto split = [&](const std::vector<BlockKey>& keys, uint32_t layers) {
    auto left = parts_.table->split_block_pins(keys, 0, layers);
    const std::vector<BlockKey>& kept = left.ok() ? *left : keys;
    std::size_t k = 0;
    for (const BlockKey& key : keys) {
      if (k < kept.size() && kept[k] == key) {
        whole.push_back(key);
        ++k;
        continue;
      }
      for (uint32_t l = 0; l < layers; ++l) step.pinned[l].push_back(key);
    }
  };
  split(reached, r.layer + 1);
  split(ahead, r.layer);
  std::erase_if(r.entries.entries, [&](const PageTable::PinnedEntries::Entry& e) {
    const auto it = std::find(whole.begin(), whole.end(), e.key);
    if (it == whole.end()) return true;
    whole.erase(it);
    return false;
  });
}

Status Scheduler::plan_layer(Step& step, uint32_t layer) {
  step.planned[layer] = 1;
  const uint32_t pt = options_.geometry.page_tokens;
  LayerTable& table = step.shared->tables[layer];
  std::shared_ptr<LayerReadiness> ready = step.shared->ready[layer];
  table.indptr.assign(1, 0);
  table.last_page_len.clear();
  uint32_t total = 0;
  for (std::size_t i = 0; i < step.items.size(); ++i) {
    total += step.items[i].pages;
    table.indptr.push_back(static_cast<int32_t>(total));
    const uint64_t tokens =
        step.items[i].context_tokens + step.items[i].recomputed_tokens + step.items[i].new_tokens;
    const uint64_t rem = tokens % pt;
    table.last_page_len.push_back(static_cast<int32_t>(tokens == 0 ? 0 : rem == 0 ? pt : rem));
  }
  table.indices.assign(total, -1);

  const StepId id = step.id;
  // The pins begin_step holds ahead for this step, while it holds them (a plan may give them back
  // in the middle of the layer).
  const auto held_ahead = [this, &step]() -> ResidentPins* {
    return pins_ahead_ != nullptr && pins_ahead_->held && pins_ahead_->step == &step ? pins_ahead_
                                                                                     : nullptr;
  };
  // Only the general path below can plan room, and so give them back: (layer, slot) is set for
  // give_back_pins_ahead before it, and `resident` read again after it.
  ResidentPins* resident = held_ahead();
  uint32_t slot = 0;
  for (std::size_t i = 0; i < step.items.size(); ++i) {
    for (const BlockKey& key : step.blocks[i]) {
      const uint32_t my_slot = slot++;
      if (resident != nullptr) {
        if (resident->pinned[my_slot]) {
          table.indices[my_slot] =
              static_cast<int32_t>(resident->frames[layer * resident->keys.size() + my_slot]);
          continue;
        }
        resident->layer = layer;
        resident->slot = my_slot;
      }
      const bool written = step.new_blocks.contains(key);
      if (!written) {
        // Resident, the common case: pinned in one lookup, nothing to wait for. (The general path
        // below ends the same way for a ready page, through a snapshot, a second lookup and two
        // callbacks: most of a decode step's cost when it ran for every page.)
        if (const std::optional<uint32_t> frame = parts_.table->pin_ready(key, layer)) {
          step.pinned[layer].push_back(key);
          table.indices[my_slot] = static_cast<int32_t>(*frame);
          continue;
        }
      }
      ready->add_pending();
      auto on_filling = [this, id, layer, key, my_slot](uint32_t frame) {
        auto it = steps_.find(id);
        if (it == steps_.end() || it->second->ended || it->second->released[layer]) return;
        Step& st = *it->second;
        auto pinned = parts_.table->pin(key, layer);
        if (!pinned.ok()) {
          st.shared->ready[layer]->page_failed(pinned.status());
          return;
        }
        st.pinned[layer].push_back(key);
        st.shared->tables[layer].indices[my_slot] = static_cast<int32_t>(*pinned);
        (void)frame;
      };
      const auto loaded = [ready](const Status& s) {
        if (s.ok()) {
          ready->page_arrived();
        } else {
          ready->page_failed(s);
        }
      };
      if (written) {
        plan_written_page(id, key, layer, step.refilled.contains(key), on_filling, ready, 0);
      } else {
        ensure_in_hbm(key, layer, TransferPriority::kDemand, on_filling, loaded);
      }
      resident = held_ahead();
    }
  }
  if (resident != nullptr) {
    resident->layer = layer;
    resident->slot = resident->keys.size();  // every page of the layer reached
  }
  ready->seal();
  return ok_status();
}

void Scheduler::plan_written_page(StepId id, const BlockKey& key, uint32_t layer, bool refill,
                                  std::function<void(uint32_t)> on_filling,
                                  std::shared_ptr<LayerReadiness> ready, int attempt) {
  // Nothing to load: the engine writes this page into a frame, pinned. A refilled block may have
  // an HBM copy, or one on its way (loaded for another sequence, or prefetched): the step waits
  // for it instead, as for a reused page, and should that load fail (a prefetch of a page with no
  // copy left) the page is written after all. A few rounds at most: each needs another load of
  // the page to start and fail in between.
  constexpr int kMaxAttempts = 4;
  const PageKey pk{key, layer, Tier::kHbm};
  const auto still_planned = [this, id, layer] {
    auto it = steps_.find(id);
    return it != steps_.end() && !it->second->ended && !it->second->released[layer];
  };
  if (refill && page_snapshot(key, layer).hbm == CopyState::kDraining) {
    // Leaving for host memory: a victim of room made since the step began (its pages are not
    // pinned until planned). Withdrawn if it still waits for a host frame, the page is ready
    // again; landed, it is written afresh (drop_host_copy_rewritten). Either way once its
    // demotion ends, not loaded back: in memory full of pages that cannot leave, the load would
    // wait for an HBM frame that only its own host copy's frame could free.
    attach(pk, [this, id, key, layer, on_filling, ready, attempt](const Status&) {
      plan_written_page(id, key, layer, true, on_filling, ready, attempt + 1);
    });
    withdraw_host_requests(&pk, Withdrawn::kDemotions, "a step writes the page");
    return;
  }
  if (refill && loaded_meanwhile(key, layer)) {
    ensure_in_hbm(
        key, layer, TransferPriority::kDemand, on_filling,
        [this, id, key, layer, pk, on_filling, ready, attempt, still_planned](const Status& s) {
          if (s.ok()) {
            ready->page_arrived();
            return;
          }
          if (attempt < kMaxAttempts && still_planned() && !ops_.contains(pk)) {
            const PageSnapshot p = page_snapshot(key, layer);
            const Step& st = *steps_.at(id);
            const bool pinned_here = std::find(st.pinned[layer].begin(), st.pinned[layer].end(),
                                               key) != st.pinned[layer].end();
            if (p.hbm == CopyState::kFilling && pinned_here) {
              // The failed load left its frame with this step: the engine writes into it.
              engine_writes_.try_emplace(pk);
              ready->page_arrived();
              return;
            }
            if (p.hbm == CopyState::kAbsent) {
              plan_written_page(id, key, layer, true, on_filling, ready, attempt + 1);
              return;
            }
          }
          ready->page_failed(s);
        });
    return;
  }
  if (refill) drop_host_copy_rewritten(key, layer);
  request_frame(
      Tier::kHbm, key, layer, TransferPriority::kDemand,
      [this, id, key, layer, pk, refill, on_filling, ready, attempt,
       still_planned](Result<uint32_t> frame) {
        if (!frame.ok() && refill && attempt < kMaxAttempts && loaded_meanwhile(key, layer)) {
          // Another sequence started loading the page while this step waited.
          plan_written_page(id, key, layer, true, on_filling, ready, attempt + 1);
          return;
        }
        if (!frame.ok()) {
          ready->page_failed(frame.status());
          return;
        }
        if (!still_planned()) {
          // The step ended before the frame came: nobody will write it.
          parts_.table->abort_fill(key, CopyId::hbm(layer)).ignore();
          after_change(key);
          serve_frame_waiters(Tier::kHbm);
          return;
        }
        // Readers of a refilled page wait for the engine's write (see engine_writes_).
        if (refill) engine_writes_.try_emplace(pk);
        on_filling(*frame);
        ready->page_arrived();
      });
}

void Scheduler::drop_host_copy_rewritten(const BlockKey& key, uint32_t layer) {
  // The page of a refilled block the engine is about to write may have a host copy (demoted since
  // the step began, its HBM copy a victim of the room made for the step's earlier pages): the last
  // copy outside HBM of a block in use, which no plan may drop and which can leave only upward,
  // into a frame such as the one the step asks for. The engine writes the same content into HBM,
  // so the host copy goes now. Kept, it held the host frame the step's admission had counted for
  // other pages kept in memory: HBM, full of private pages, waited for a host frame, and the step
  // for an HBM frame (random workload seed 5715 stalled so). A copy NVMe also holds a plan may
  // drop like any other; one in flight or read by an NVMe write is in use.
  const PageSnapshot p = page_snapshot(key, layer);
  if (p.host != CopyState::kReady || p.hbm != CopyState::kAbsent || p.nvme == CopyState::kReady ||
      p.pins > 0 || reading_.contains(key) || ops_.contains(PageKey{key, layer, Tier::kHost})) {
    return;
  }
  if (parts_.table->drop(key, CopyId::host(layer)).ok()) sync_membership(key, Tier::kHost);
}

void Scheduler::finish_written_pages(Step& step, uint32_t layer) {
  for (std::size_t i = 0; i < step.items.size(); ++i) {
    for (std::size_t b = step.first_written[i]; b < step.blocks[i].size(); ++b) {
      const BlockKey& key = step.blocks[i][b];
      if (step.new_blocks.contains(key)) {
        // The engine wrote the page: it is a complete copy now. (Not when a load fills it: a
        // refilled block another sequence loaded meanwhile; that load completes it. A load still
        // waiting for its frame finds the page written and reads it: rejoin_load_waiters.)
        if (load_fills(key, layer)) continue;
        Status s = parts_.table->complete_fill(key, CopyId::hbm(layer));
        if (!s.ok()) s.ignore();  // the frame was never granted (step ended early), or loaded
        end_engine_write(key, layer);
        continue;
      }
      // An existing page the engine appended to: copies below are stale.
      if (page_snapshot(key, layer).host == CopyState::kReady) {
        parts_.table->drop(key, CopyId::host(layer)).ignore();
        sync_membership(key, Tier::kHost);
        serve_frame_waiters(Tier::kHost);
      }
    }
  }
}

void Scheduler::abort_failed_fills(const Step& step, uint32_t layer) {
  // A load that failed while the page was pinned left it filling (give_up_fill recorded it):
  // once unpinned it is given up. Nothing failed, nothing to look up: the common case.
  if (failed_fills_.empty()) return;
  for (const auto& blocks : step.blocks) {
    for (const BlockKey& key : blocks) {
      const PageKey pk{key, layer, Tier::kHbm};
      if (!failed_fills_.contains(pk)) continue;
      const PageSnapshot p = page_snapshot(key, layer);
      if (p.hbm != CopyState::kFilling) {
        failed_fills_.erase(pk);  // already gone
      } else if (p.pins == 0 && !ops_.contains(pk)) {
        parts_.table->abort_fill(key, CopyId::hbm(layer)).ignore();
        failed_fills_.erase(pk);
        sync_membership(key, Tier::kHbm);
      }
    }
  }
}

void Scheduler::release_resident_pins(Step& step) {
  parts_.table->unpin_blocks(step.resident).ignore();
  step.resident.entries.clear();
}

void Scheduler::unpin_layer(Step& step, uint32_t layer) {
  // One lock per shard for the layer's pins; a page whose pin is gone already (its block was
  // given up) is passed over.
  parts_.table->unpin_layer(step.pinned[layer], layer).ignore();
  step.pinned[layer].clear();
}

void Scheduler::release_layer(Step& step, uint32_t layer) {
  step.released[layer] = 1;
  unpin_layer(step, layer);
  abort_failed_fills(step, layer);
  if (step.windowed) {
    // The context does not fit: the finished layer leaves HBM now, to make room for the next.
    for (const auto& blocks : step.blocks) {
      for (const BlockKey& key : blocks) {
        const PageSnapshot p = page_snapshot(key, layer);
        if (p.hbm != CopyState::kReady || p.pins != 0 || protected_.contains(key)) continue;
        if (p.host == CopyState::kReady) {
          parts_.table->drop(key, CopyId::hbm(layer)).ignore();
          stats_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
          sync_membership(key, Tier::kHbm);
        } else if (p.host == CopyState::kAbsent) {
          demote_page_to_host(key, layer, TransferPriority::kDemand);
        }
      }
    }
    serve_frame_waiters(Tier::kHbm);
  }
  // HBM's policy hears, in the batch's order, of the pages the engine wrote (finish_written_pages
  // made them copies) and, windowed, of the pages that began to leave above (a block whose last
  // ready page drains leaves the policy). The context a step that is not windowed only read
  // changed no membership here (loads and aborted fills report their own), so it is not walked
  // again for every layer.
  for (std::size_t i = 0; i < step.blocks.size(); ++i) {
    const std::size_t first = step.windowed ? 0 : step.first_written[i];
    for (std::size_t b = first; b < step.blocks[i].size(); ++b) {
      sync_membership(step.blocks[i][b], Tier::kHbm);
    }
  }
  // Unpinned pages may be what a waiting request needs room from.
  serve_frame_waiters(Tier::kHbm);
}

Status Scheduler::end_layer(StepId id, uint32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(Step * step, find_step(id));
  if (layer >= step->layers) {
    return out_of_range("end_layer: layer " + std::to_string(layer) + " of step " +
                        std::to_string(id) + " (the model has " + std::to_string(step->layers) +
                        " layers)");
  }
  if (!step->planned[layer]) {
    return failed_precondition("end_layer: layer " + std::to_string(layer) + " of step " +
                               std::to_string(id) + " was not begun (window " +
                               std::to_string(step->window) + "; end earlier layers first)");
  }
  if (step->released[layer]) {
    return failed_precondition("end_layer: layer " + std::to_string(layer) + " of step " +
                               std::to_string(id) + " was already ended");
  }
  if (!step->shared->ready[layer]->ready()) {
    // Its pages cannot have been written (the engine gets a layer's table only once it is
    // ready): completing them would make unwritten frames a cached copy.
    return failed_precondition("end_layer: layer " + std::to_string(layer) + " of step " +
                               std::to_string(id) +
                               " is not ready (failed, or not waited for); wait_layer first, "
                               "or abort_step when it failed");
  }
  finish_written_pages(*step, layer);
  release_layer(*step, layer);
  // Keep the window full: plan the next layer not yet planned.
  bool planned_next = false;
  for (uint32_t l = 0; l < step->layers && !planned_next; ++l) {
    if (!step->planned[l]) {
      KVTIER_RETURN_IF_ERROR(plan_layer(*step, l));
      planned_next = true;
    }
  }
  if (!planned_next && step->windowed && layer + step->window >= step->layers) {
    // The window wraps into the next step: decode repeats over the same sequences, so the frames
    // this layer frees start loading the next step's first layers now, and the next step does not
    // begin with an empty pipeline.
    const uint32_t next_layer = layer + step->window - step->layers;
    for (const auto& blocks : step->blocks) {
      for (const BlockKey& key : blocks) {
        ensure_in_hbm(key, next_layer, TransferPriority::kPrefetch, nullptr,
                      [](const Status& s) { s.ignore(); });
      }
    }
  }
  want_watermark_check();
  return ok_status();
}

bool Scheduler::refillable(const BlockKey& key) const {
  // Referenced by no sequence and pinned by no step: this step can take the entry as its own and
  // write the block's pages into it. Its other copies hold the same content (a block's K/V is a
  // function of its tokens and their prefix) and stay valid; an HBM copy that is present or on
  // its way is waited for like a reused one, and the engine writes the same values over it.
  bool ok = false;
  Status s = parts_.table->visit(
      key, [&](const EntryView& v) { ok = v.refcount() == 0 && v.pinned_pages() == 0; });
  return s.ok() && ok;
}

void Scheduler::end_engine_write(const BlockKey& key, uint32_t layer) {
  // The page is complete (or its write was given up): readers that waited ask again, and find it
  // ready or load it.
  auto it = engine_writes_.find(PageKey{key, layer, Tier::kHbm});
  if (it == engine_writes_.end()) return;
  std::vector<std::function<void()>> waiting = std::move(it->second);
  engine_writes_.erase(it);
  for (auto& retry : waiting) retry();
}

bool Scheduler::load_fills(const BlockKey& key, uint32_t layer) const {
  auto it = ops_.find(PageKey{key, layer, Tier::kHbm});
  return it != ops_.end() && !it->second->drain && it->second->frame.has_value();
}

bool Scheduler::loaded_meanwhile(const BlockKey& key, uint32_t layer) const {
  // A refilled block may have an HBM copy, or one on its way (loaded for another sequence, or
  // prefetched). The step then waits for it as for a reused page instead of filling a frame —
  // except for a prefetch no step has joined that has not taken its frame yet (still reading
  // from NVMe, or waiting for the frame): a prefix given up as late (on_late = recompute) is
  // exactly what open_sequence's prefetch is still bringing, and waiting for it would make the
  // engine recompute and stall. The engine writes the page; the prefetch then finds it written
  // and has nothing to do (rejoin_load_waiters).
  if (page_snapshot(key, layer).hbm != CopyState::kAbsent) return true;
  auto it = ops_.find(PageKey{key, layer, Tier::kHbm});
  return it != ops_.end() && !it->second->prefetch;
}

Status Scheduler::end_step(StepId id, std::span<const StepCompletion> completions) {
  KVTIER_ASSIGN_OR_RETURN(Step * step, find_step(id));
  if (std::find(step->planned.begin(), step->planned.end(), 0) != step->planned.end()) {
    // A windowed step whose last layers were never reached: their pages were not written, so the
    // step cannot count its tokens. Undo it and say why.
    const uint32_t reached =
        static_cast<uint32_t>(std::count(step->planned.begin(), step->planned.end(), 1));
    KVTIER_RETURN_IF_ERROR(abort_step(id));
    return failed_precondition("end_step: step " + std::to_string(id) + " is windowed and only " +
                               std::to_string(reached) + " of its layers were begun; call " +
                               "end_layer for every layer before end_step (the step was aborted)");
  }
  for (uint32_t l = 0; l < step->layers; ++l) {
    if (step->released[l] || step->shared->ready[l]->ready()) continue;
    // A layer that failed or was never waited for: its pages were not written, and completing
    // them would cache unwritten frames under the blocks' keys. Undo the step and say why.
    KVTIER_RETURN_IF_ERROR(abort_step(id));
    return failed_precondition("end_step: layer " + std::to_string(l) + " of step " +
                               std::to_string(id) +
                               " never became ready (a load failed, or it was not waited for); "
                               "its pages were not written, so the step was aborted");
  }
  release_resident_pins(*step);
  for (uint32_t l = 0; l < step->layers; ++l) {
    if (!step->released[l]) {
      finish_written_pages(*step, l);
      release_layer(*step, l);
    }
  }
  // Prompt blocks made under their content keys are complete now: shareable, and written down
  // as the write policy says.
  for (const BlockKey& key : step->new_blocks) {
    if (key.is_private()) continue;
    (step->refilled.contains(key) ? stats_.blocks_refilled : stats_.blocks_published)
        .fetch_add(1, std::memory_order_relaxed);
    apply_write_policy(key);
  }
  step->ended = true;
  Status first;
  for (std::size_t i = 0; i < step->items.size(); ++i) {
    auto seq_r = find_sequence(step->items[i].sequence);
    if (!seq_r.ok()) continue;
    Sequence& seq = **seq_r;
    seq.active_step = 0;
    const uint64_t old = step->tokens_before[i];
    seq.tokens = step->items[i].context_tokens + step->items[i].recomputed_tokens +
                 step->items[i].new_tokens;
    seq.owed_recompute = 0;
    const StepCompletion* c = nullptr;
    for (const StepCompletion& comp : completions) {
      if (comp.sequence == seq.id) c = &comp;
    }
    Status s = publish_full_blocks(seq, std::min(old, step->items[i].context_tokens), c);
    if (!s.ok() && first.ok()) first = s;
  }
  {
    std::lock_guard<std::mutex> lock(published_mu_);
    published_.erase(id);
  }
  steps_.erase(id);
  publish_pending();
  want_watermark_check();
  return first;
}

void Scheduler::abort_all_steps() {
  std::vector<StepId> open;
  for (const auto& [id, step] : steps_) open.push_back(id);
  for (StepId id : open) abort_step(id).ignore();
}

Status Scheduler::abort_step(StepId id) {
  KVTIER_ASSIGN_OR_RETURN(Step * step, find_step(id));
  // Anyone still waiting on a layer of this step learns now, not at its timeout.
  for (uint32_t l = 0; l < step->layers; ++l) {
    if (!step->shared->ready[l]->finished()) {
      step->shared->ready[l]->page_failed(cancelled("step " + std::to_string(id) + " was aborted"));
    }
  }
  for (uint32_t l = 0; l < step->layers; ++l) {
    if (step->planned[l] && !step->released[l]) {
      step->released[l] = 1;
      unpin_layer(*step, l);
      abort_failed_fills(*step, l);
    }
  }
  release_resident_pins(*step);
  step->ended = true;
  for (std::size_t i = 0; i < step->items.size(); ++i) {
    auto seq_r = find_sequence(step->items[i].sequence);
    if (!seq_r.ok()) continue;
    Sequence& seq = **seq_r;
    seq.active_step = 0;
    seq.tokens = step->tokens_before[i];
    // Blocks made for this step go away with the pages the engine never finished.
    while (!seq.blocks.empty() && step->new_blocks.contains(seq.blocks.back())) {
      const BlockKey key = seq.blocks.back();
      seq.blocks.pop_back();
      for (uint32_t l = 0; l < step->layers; ++l) {
        // Only the fills the engine was to write; a load another sequence started goes on.
        if (load_fills(key, l)) continue;
        parts_.table->abort_fill(key, CopyId::hbm(l)).ignore();
        end_engine_write(key, l);
      }
      parts_.table->release(key).status().ignore();
      facts_.erase(key);
      after_change(key);
    }
  }
  {
    std::lock_guard<std::mutex> lock(published_mu_);
    published_.erase(id);
  }
  steps_.erase(id);
  for (Tier t : {Tier::kHbm, Tier::kHost}) serve_frame_waiters(t);
  return ok_status();
}

Status Scheduler::wait_layer(StepId step, uint32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(auto shared, published(step));
  if (layer >= shared->ready.size()) {
    return out_of_range("wait_layer: layer " + std::to_string(layer) + " of step " +
                        std::to_string(step));
  }
  Nanos waited = 0;
  Status s = shared->ready[layer]->wait(options_.wait_timeout, &waited);
  // Waking from an uncontended condition variable takes microseconds; only longer waits are
  // stalls (the layer was not ready when the engine needed it).
  constexpr Nanos kStallThreshold = 20 * kNanosPerMicro;
  if (waited > kStallThreshold) {
    stats_.stalls.fetch_add(1, std::memory_order_relaxed);
    stats_.stall_nanos.fetch_add(static_cast<uint64_t>(waited), std::memory_order_relaxed);
    if (shared->stall_deadline > 0 && waited > shared->stall_deadline) {
      stats_.deadline_misses.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return s;
}

Result<LayerTable> Scheduler::layer_table(StepId step, uint32_t layer) const {
  KVTIER_ASSIGN_OR_RETURN(auto shared, published(step));
  if (layer >= shared->ready.size()) {
    return out_of_range("layer_table: layer " + std::to_string(layer) + " of step " +
                        std::to_string(step));
  }
  if (!shared->ready[layer]->ready()) {
    return failed_precondition("layer_table: layer " + std::to_string(layer) + " of step " +
                               std::to_string(step) + " is not ready; wait_layer first");
  }
  return shared->tables[layer];
}

Result<std::shared_ptr<LayerReadiness>> Scheduler::layer_readiness(StepId step,
                                                                   uint32_t layer) const {
  KVTIER_ASSIGN_OR_RETURN(auto shared, published(step));
  if (layer >= shared->ready.size()) {
    return out_of_range("layer " + std::to_string(layer) + " of step " + std::to_string(step));
  }
  return shared->ready[layer];
}

}  // namespace kvtier
