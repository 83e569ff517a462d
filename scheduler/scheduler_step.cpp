// Scheduler: the step contract — begin_step, per-layer planning and release, end_step, waits.
// Publishing the blocks a step filled is in scheduler_publish.cpp. See scheduler.hpp.
#include <algorithm>
#include <string>

#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"
#include "scheduler/shared_prefixes.hpp"

namespace kvtier {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Whether block `b` of a sequence with `prompt_blocks` prompt keys is a prompt block that a step
// leaving the sequence at `tokens_after` tokens fills completely (made under its content key).
bool fills_prompt_block(uint64_t b, std::size_t prompt_blocks, uint64_t tokens_after,
                        uint32_t page_tokens) {
  return (b + 1) * page_tokens <= tokens_after && b < prompt_blocks;
}

}  // namespace

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

void Scheduler::recompute_late_prefix(Sequence& seq) {
  // The first step of a sequence, with prefetch.on_late = recompute: give up the reused blocks that
  // are predicted to arrive after the deadline; the engine recomputes them in this step instead.
  const Nanos deadline =
      static_cast<Nanos>(options_.policies.prefetch.deadline_ms) * kNanosPerMilli;
  uint32_t pending_host = 0;
  uint32_t pending_nvme = 0;
  for (uint32_t b = 0; b < seq.reused_blocks && b < seq.blocks.size(); ++b) {
    auto info = parts_.table->lookup(seq.blocks[b]);
    if (!info.ok() || !info->match_tier) continue;
    if (*info->match_tier == Tier::kHbm) continue;
    (*info->match_tier == Tier::kNvme ? pending_nvme : pending_host) += 1;
    const Nanos eta = estimated_load_time(Tier::kHost, pending_host + pending_nvme) +
                      (pending_nvme > 0 ? estimated_load_time(Tier::kNvme, pending_nvme) -
                                              estimated_load_time(Tier::kHost, pending_nvme)
                                        : 0);
    if (eta <= deadline) continue;
    // Blocks [b, reused) go back to the cache; the sequence restarts from block b.
    const uint64_t keep_tokens = static_cast<uint64_t>(b) * options_.geometry.page_tokens;
    const uint32_t given_up = static_cast<uint32_t>(seq.blocks.size()) - b;
    for (uint32_t j = b; j < seq.blocks.size(); ++j) {
      parts_.table->release(seq.blocks[j]).status().ignore();
    }
    seq.blocks.resize(b);
    const uint64_t given_up_tokens = seq.tokens - keep_tokens;
    seq.owed_recompute += given_up_tokens;
    seq.tokens = keep_tokens;
    seq.reused_blocks = b;
    stats_.recompute_blocks.fetch_add(given_up, std::memory_order_relaxed);
    stats_.recompute_tokens.fetch_add(given_up_tokens, std::memory_order_relaxed);
    return;
  }
}

Result<StepInfo> Scheduler::begin_step(std::span<const StepItem> batch) {
  if (batch.empty()) return invalid_argument("begin_step with an empty batch");
  const uint32_t pt = options_.geometry.page_tokens;
  const uint32_t layers = options_.geometry.layers;
  std::vector<Sequence*> seqs;
  std::unordered_set<SequenceId> seen;
  for (const StepItem& item : batch) {
    KVTIER_ASSIGN_OR_RETURN(Sequence * seq, find_sequence(item.sequence));
    if (!seen.insert(item.sequence).second) {
      return invalid_argument("begin_step: sequence " + std::to_string(item.sequence) +
                              " appears twice in one batch");
    }
    if (seq->active_step != 0) {
      return failed_precondition("begin_step: sequence " + std::to_string(item.sequence) +
                                 " is already in step " + std::to_string(seq->active_step));
    }
    seqs.push_back(seq);
  }

  auto step = std::make_unique<Step>();
  step->id = ++next_step_;
  step->layers = layers;
  step->begun = parts_.loop->now();
  step->shared = std::make_shared<PublishedStep>();

  // Give up late prefixes first (it changes how many tokens each item writes). What is given up
  // stays owed to the sequence until a step that recomputes it ends, whatever fails below.
  std::vector<StepItemInfo> infos(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!seqs[i]->started && options_.policies.prefetch.on_late == LatePolicy::kRecompute) {
      recompute_late_prefix(*seqs[i]);
    }
    infos[i].sequence = batch[i].sequence;
    infos[i].context_tokens = seqs[i]->tokens;
    infos[i].recomputed_tokens = static_cast<uint32_t>(seqs[i]->owed_recompute);
    infos[i].new_tokens = batch[i].new_tokens;
  }

  // Does one layer of the batch fit in HBM? Does all of it? A layer takes a frame per block of the
  // batch, but for blocks an earlier sequence of the batch holds too (a shared prompt) and blocks
  // of pinned prefixes (frames_held counts them). The batch's blocks kept in memory, those it will
  // open and those it holds, are counted for frames_kept_in_memory.
  std::vector<std::span<const BlockKey>> contexts(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const uint64_t total = seqs[i]->tokens + infos[i].recomputed_tokens + infos[i].new_tokens;
    infos[i].pages = static_cast<uint32_t>(ceil_div(total, pt));
    contexts[i] = std::span(seqs[i]->blocks.data(),
                            std::min<std::size_t>(infos[i].pages, seqs[i]->blocks.size()));
  }
  std::vector<uint32_t> shared = shared_prefix_lengths(contexts);
  uint64_t needed_per_layer = 0;
  KeptBlocks batch_kept;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::span<const BlockKey> own = contexts[i].subspan(shared[i]);
    const std::size_t known = contexts[i].size();
    needed_per_layer += own.size() - protected_count(own) + (infos[i].pages - known);
    // Every block the step opens stays in memory while it writes it: a private one until it is
    // published, and a prompt block it fills under its content key too, as NVMe takes only whole
    // blocks and its last layers are written last.
    batch_kept.opened += infos[i].pages - known;
  }
  const uint64_t capacity = parts_.hbm->capacity();
  const uint64_t held = frames_held();
  // Counting the blocks the batch holds walks its whole context: only when every page kept in
  // memory there is, the batch's own counted as outside HBM, could overflow host memory (the
  // common case, with NVMe and full blocks published, keeps nothing in HBM for them).
  KeptBlocks bound = batch_kept;
  bound.trades = true;
  if (frames_kept_in_memory(bound, /*window=*/0, held) > 0) {
    for (std::size_t i = 0; i < batch.size(); ++i) {
      for (const BlockKey& key : contexts[i].subspan(shared[i])) {
        batch_kept.held += held_block_kept_in_memory(key) && !protected_.contains(key);
      }
    }
    batch_kept.trades = batch_kept.held > 0;
  }
  // HBM frames the batch may have when it computes `w` layers at a time.
  const auto available_for = [&](uint64_t w) {
    const uint64_t taken = held + frames_kept_in_memory(batch_kept, w, held);
    return capacity > taken ? capacity - taken : 0;
  };
  if (needed_per_layer > available_for(1)) {
    const uint64_t available = available_for(1);
    const std::string in_use = std::to_string(parts_.table->referenced_blocks()) +
                               " blocks in use, " + std::to_string(parts_.table->private_blocks()) +
                               " of them private,";
    const std::string kept =
        parts_.nvme != nullptr
            ? "hold pages of private blocks, which cannot go to NVMe, and of blocks in use that "
              "NVMe has no room for, which do not fit in host memory: " +
                  in_use + " NVMe has room for " + std::to_string(parts_.nvme->capacity()) +
                  " blocks; in all " + std::to_string(blocks_kept_in_memory()) + " blocks"
            : "hold pages of blocks in use, which cannot leave memory without an NVMe tier and "
              "do not fit in host memory: " +
                  in_use;
    return resource_exhausted(
        "begin_step: one layer of this batch needs " + std::to_string(needed_per_layer) +
        " HBM frames (" + std::to_string(needed_per_layer * options_.geometry.page_bytes()) +
        " bytes) but only " + std::to_string(available) + " of " + std::to_string(capacity) +
        " are available (the rest are reserved by other open steps or hold pinned prefixes: " +
        std::to_string(protected_.size()) + " blocks; or " + kept + " of " +
        std::to_string(layers) + " pages)");
  }
  uint32_t window = layers;
  if (needed_per_layer * layers > available_for(layers)) {
    // Layer by layer: the computing layer plus `layer_window` loading ahead, as HBM allows. Each
    // layer the window gives up leaves HBM room but puts the batch's pages kept in memory of that
    // layer in host memory (frames_kept_in_memory), so the widest window that fits is searched.
    window = static_cast<uint32_t>(std::min<uint64_t>(
        layers, static_cast<uint64_t>(options_.policies.prefetch.layer_window) + 1));
    while (window > 1 && needed_per_layer * window > available_for(window)) --window;
    step->windowed = true;
  }
  step->window = window;
  step->shared_blocks = std::move(shared);

  // Create the blocks the appended tokens need (private until full and published).
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Sequence& seq = *seqs[i];
    step->tokens_before.push_back(seq.tokens);
    const uint64_t written = infos[i].recomputed_tokens + infos[i].new_tokens;
    step->first_written.push_back(written == 0 ? infos[i].pages
                                               : static_cast<uint32_t>(seq.tokens / pt));
    const uint64_t tokens_after = seq.tokens + infos[i].recomputed_tokens + infos[i].new_tokens;
    while (seq.blocks.size() < infos[i].pages) {
      const uint64_t b = seq.blocks.size();
      // A prompt block this step fills completely is made under its content key at once (it is
      // not cached until its pages are complete, so nobody can match it half-written). One whose
      // key is in the table already — recomputed because loading it (or a block before it) was
      // slower, or an entry kept for its children — is written into that entry when no other
      // sequence references it (refilled): keyed, its pages can leave memory like any cached
      // block's instead of crowding host memory as private pages that can go nowhere else.
      // Otherwise — a block left partial, a key in use, or no key known — it is private until
      // published.
      const bool prompt = fills_prompt_block(b, seq.prompt_keys.size(), tokens_after, pt);
      const bool keyed = prompt && !parts_.table->contains(seq.prompt_keys[b]);
      const bool refill = prompt && !keyed && refillable(seq.prompt_keys[b]);
      const BlockKey key =
          keyed || refill ? seq.prompt_keys[b] : private_block_key(seq.id, ++seq.next_private);
      const BlockKey parent =
          seq.blocks.empty() || seq.blocks.back().is_private() ? BlockKey{} : seq.blocks.back();
      Status s = refill ? parts_.table->acquire(key)
                        : parts_.table->create_block(key, parent, /*initial_refs=*/1);
      if (!s.ok()) {
        // Undo the blocks made or refilled so far for every item of this batch.
        for (const BlockKey& made : step->new_blocks) {
          for (auto& other : seqs) {
            auto it = std::find(other->blocks.begin(), other->blocks.end(), made);
            if (it != other->blocks.end()) other->blocks.erase(it);
          }
          parts_.table->release(made).status().ignore();
          if (!step->refilled.contains(made)) parts_.table->erase(made).ignore();
        }
        return s.with_context("begin_step");
      }
      if (refill) step->refilled.insert(key);
      facts_[key] = RequestFacts{static_cast<uint32_t>(seq.blocks.size()), seq.reused_blocks,
                                 static_cast<uint32_t>(seq.prompt_keys.size())};
      seq.blocks.push_back(key);
      step->new_blocks.insert(key);
    }
    step->blocks.emplace_back(seq.blocks.begin(), seq.blocks.begin() + infos[i].pages);
  }

  step->items = infos;
  step->shared->ready.resize(layers);
  step->shared->tables.resize(layers);
  for (auto& r : step->shared->ready) r = std::make_shared<LayerReadiness>();
  step->shared->stall_deadline =
      static_cast<Nanos>(options_.policies.prefetch.deadline_ms) * kNanosPerMilli;
  step->pinned.resize(layers);
  step->planned.assign(layers, 0);
  step->released.assign(layers, 0);
  for (Sequence* seq : seqs) {
    seq->active_step = step->id;
    seq->started = true;
  }
  {
    std::lock_guard<std::mutex> lock(published_mu_);
    published_.emplace(step->id, step->shared);
  }
  Step& s = *step;
  steps_.emplace(s.id, std::move(step));
  stats_.steps.fetch_add(1, std::memory_order_relaxed);
  if (s.windowed) stats_.windowed_steps.fetch_add(1, std::memory_order_relaxed);
  ResidentPins& resident = *resident_pins_;
  resident.reset();
  if (!s.windowed) pin_resident_blocks(s, resident);
  pins_ahead_ = &resident;  // room made from here on gives these pins back first
  if (!s.windowed) {
    // Every layer of each block is needed: bring NVMe-only blocks up with one read each. A block
    // pinned above is in HBM in every layer, and needs none.
    std::size_t slot = 0;  // resident.keys lists the step's blocks in this order
    for (const auto& blocks : s.blocks) {
      for (const BlockKey& key : blocks) {
        if (resident.pinned[slot++] == 0 && !s.new_blocks.contains(key)) {
          ensure_block_in_host(key, TransferPriority::kDemand);
        }
      }
    }
  }
  Status planned = ok_status();
  for (uint32_t l = 0; l < s.window && planned.ok(); ++l) planned = plan_layer(s, l);
  pins_ahead_ = nullptr;
  // The blocks still pinned whole (all of them when no room was planned meanwhile) stay so until
  // the step ends.
  s.resident = std::move(resident.entries);
  KVTIER_RETURN_IF_ERROR(planned);

  StepInfo info;
  info.id = s.id;
  info.layers = layers;
  info.window = s.window;
  info.windowed = s.windowed;
  info.items = s.items;
  return info;
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

// HBM frames begin_step cannot give a new batch: every layer of each pinned-prefix block (never an
// HBM victim) and each open step's frames per layer x window, pinned or not yet — a step pins its
// frames only as they are granted, so counting pins alone would let two steps each take part of
// HBM and wait on each other until the timeout. A step's frames per layer are its blocks but those
// an earlier item of its batch holds too, and those of pinned prefixes (counted with the prefix).
uint64_t Scheduler::frames_held() const {
  uint64_t held = static_cast<uint64_t>(protected_.size()) * options_.geometry.layers;
  for (const auto& [id, step] : steps_) {
    uint64_t frames = 0;
    for (std::size_t i = 0; i < step->blocks.size(); ++i) {
      const auto own = std::span(step->blocks[i]).subspan(step->shared_blocks[i]);
      frames += own.size() - protected_count(own);
    }
    held += frames * step->window;
  }
  return held;
}

// Pages of blocks kept in memory (kvtier::kept_in_memory: private blocks, whose pages are never
// written to NVMe as it is addressed by content key, and without NVMe every block in use) live in
// HBM or host memory; what host memory cannot hold of them holds HBM frames no plan can free. They
// are every page of each such block outside the batch, and the batch's own of the layers outside
// its window (a windowed step keeps only the window's layers in HBM). Host memory offers its frames
// but its reserve, and when the batch holds such blocks one frame less, for trades: a page of
// theirs waiting in host memory comes up only into a free HBM frame, and a page goes down to free
// one only into a free host frame, so memory filled to the last frame with pages that cannot leave
// would keep the step's pages where they are until its timeout (the random simulation found such
// steps). A batch that only opens blocks writes them in HBM and needs no trade. An estimate from
// the table's counts of private and referenced blocks:
// - with NVMe, private pages not yet written and those in another open step's window (counted in
//   frames_held too) make it count a little high, which at worst makes a step use a narrower
//   window; blocks in use beyond what NVMe holds count as kept (blocks_kept_in_memory);
// - without NVMe, every page frames_held counts (pinned prefixes, open steps' windows) belongs to
//   a block in use, so those pages are taken off; a block two steps share is taken off twice,
//   which makes it count low, and a step that does not fit after all waits for its frames.
uint64_t Scheduler::frames_kept_in_memory(const KeptBlocks& batch, uint64_t window,
                                          uint64_t frames_held) const {
  const uint64_t layers = options_.geometry.layers;
  const bool nvme = parts_.nvme != nullptr;
  const uint64_t all = blocks_kept_in_memory();
  const uint64_t others = all > batch.held ? all - batch.held : 0;
  const uint64_t outside_window = layers - std::min(layers, window);
  uint64_t pages = others * layers + (batch.held + batch.opened) * outside_window;
  if (!nvme) pages -= std::min(pages, frames_held);
  const uint64_t host = parts_.host->capacity();
  const uint64_t trade_frames = batch.trades ? 1 : 0;
  const uint64_t host_room = host - std::min(host, reserve_frames(Tier::kHost) + trade_frames);
  return pages > host_room ? pages - host_room : 0;
}

uint64_t Scheduler::blocks_kept_in_memory() const {
  const uint64_t referenced = parts_.table->referenced_blocks();
  if (parts_.nvme == nullptr) return referenced;
  const uint64_t private_blocks = parts_.table->private_blocks();
  const uint64_t keyed = referenced - std::min(referenced, private_blocks);
  const uint64_t extents = parts_.nvme->capacity();
  return private_blocks + (keyed > extents ? keyed - extents : 0);
}

uint64_t Scheduler::protected_count(std::span<const BlockKey> keys) const {
  if (protected_.empty()) return 0;
  return static_cast<uint64_t>(std::count_if(
      keys.begin(), keys.end(), [this](const BlockKey& k) { return protected_.contains(k); }));
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
  check_watermarks();
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
  check_watermarks();
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
