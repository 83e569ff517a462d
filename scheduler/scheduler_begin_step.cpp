// Scheduler: admitting a batch — begin_step, in five phases: the batch's sequences, what each item
// computes (late prefixes given up first), how many layers at a time fit in HBM (the window, or an
// error that says what was needed and what was available), the blocks the appended tokens need,
// and the plans of the first window's layers. With the HBM frame accounting the window is fitted
// by (frames_held, frames_kept_in_memory). See scheduler.hpp.
#include <algorithm>
#include <string>
#include <unordered_set>

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

Result<StepInfo> Scheduler::begin_step(std::span<const StepItem> batch) {
  if (batch.empty()) return invalid_argument("begin_step with an empty batch");
  KVTIER_ASSIGN_OR_RETURN(std::vector<Sequence*> seqs, batch_sequences(batch));

  auto step = std::make_unique<Step>();
  step->id = ++next_step_;
  step->layers = options_.geometry.layers;
  step->begun = parts_.loop->now();
  step->shared = std::make_shared<PublishedStep>();
  // Late prefixes are given up first (it changes how many tokens each item writes). What is given
  // up stays owed to the sequence until a step that recomputes it ends, whatever fails below.
  step->items = step_items(batch, seqs);
  KVTIER_RETURN_IF_ERROR(fit_window(*step, seqs));
  KVTIER_RETURN_IF_ERROR(open_written_blocks(*step, seqs));

  const uint32_t layers = step->layers;
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
  KVTIER_RETURN_IF_ERROR(plan_first_layers(s));

  StepInfo info;
  info.id = s.id;
  info.layers = layers;
  info.window = s.window;
  info.windowed = s.windowed;
  info.items = s.items;
  return info;
}

Result<std::vector<Scheduler::Sequence*>> Scheduler::batch_sequences(
    std::span<const StepItem> batch) {
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
  return seqs;
}

std::vector<StepItemInfo> Scheduler::step_items(std::span<const StepItem> batch,
                                                std::span<Sequence* const> seqs) {
  std::vector<StepItemInfo> infos(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Sequence& seq = *seqs[i];
    if (!seq.started && options_.policies.prefetch.on_late == LatePolicy::kRecompute) {
      recompute_late_prefix(seq);
    }
    if (!lost_blocks_.empty()) recompute_lost_blocks(seq);
    infos[i].sequence = batch[i].sequence;
    infos[i].context_tokens = seq.tokens;
    infos[i].recomputed_tokens = static_cast<uint32_t>(seq.owed_recompute);
    infos[i].new_tokens = batch[i].new_tokens;
    const uint64_t total = seq.tokens + infos[i].recomputed_tokens + infos[i].new_tokens;
    infos[i].pages = static_cast<uint32_t>(ceil_div(total, options_.geometry.page_tokens));
  }
  return infos;
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
    give_up_blocks_from(seq, b);
    return;
  }
}

void Scheduler::recompute_lost_blocks(Sequence& seq) {
  // A block whose only copy failed to read from NVMe (lost_blocks_): the sequence gives it up, and
  // every block after it, and the engine recomputes their tokens in this step, as it does a late
  // prefix (recomputed_tokens). Not while a block of the sequence waits to be published (that
  // entry holds it).
  for (uint32_t b = 0; b < seq.blocks.size(); ++b) {
    if (!lost_blocks_.contains(seq.blocks[b]) || !lacks_a_page(seq.blocks[b])) continue;
    const bool publishing =
        std::any_of(pending_publish_.begin(), pending_publish_.end(),
                    [&](const PendingPublish& p) { return p.sequence == seq.id; });
    if (!publishing) give_up_blocks_from(seq, b);
    return;
  }
}

void Scheduler::give_up_blocks_from(Sequence& seq, uint32_t b) {
  const uint64_t keep_tokens = static_cast<uint64_t>(b) * options_.geometry.page_tokens;
  const uint32_t given_up = static_cast<uint32_t>(seq.blocks.size()) - b;
  for (uint32_t j = b; j < seq.blocks.size(); ++j) release_sequence_block(seq.blocks[j]).ignore();
  seq.blocks.resize(b);
  const uint64_t given_up_tokens = seq.tokens - std::min(seq.tokens, keep_tokens);
  seq.owed_recompute += given_up_tokens;
  seq.tokens = std::min(seq.tokens, keep_tokens);
  seq.reused_blocks = std::min(seq.reused_blocks, b);
  stats_.recompute_blocks.fetch_add(given_up, std::memory_order_relaxed);
  stats_.recompute_tokens.fetch_add(given_up_tokens, std::memory_order_relaxed);
  // The frames of private blocks given up are free now, and the pages of the others may be
  // victims: what a request waits for (as when a sequence closes).
  for (Tier t : {Tier::kHbm, Tier::kHost}) serve_frame_waiters(t);
}

Status Scheduler::fit_window(Step& step, std::span<Sequence* const> seqs) {
  // Does one layer of the batch fit in HBM? Does all of it? A layer takes a frame per block of the
  // batch, but for blocks an earlier sequence of the batch holds too (a shared prompt) and blocks
  // of pinned prefixes (frames_held counts them). The batch's blocks kept in memory, those it will
  // open and those it holds, are counted for frames_kept_in_memory.
  const std::vector<StepItemInfo>& infos = step.items;
  std::vector<std::span<const BlockKey>> contexts(infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i) {
    contexts[i] = std::span(seqs[i]->blocks.data(),
                            std::min<std::size_t>(infos[i].pages, seqs[i]->blocks.size()));
  }
  std::vector<uint32_t> shared = shared_prefix_lengths(contexts);
  uint64_t needed_per_layer = 0;
  KeptBlocks batch_kept;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const std::span<const BlockKey> own = contexts[i].subspan(shared[i]);
    const std::size_t known = contexts[i].size();
    needed_per_layer += own.size() - protected_count(own) + (infos[i].pages - known);
    // Every block the step opens stays in memory while it writes it: a private one until it is
    // published, and a prompt block it fills under its content key too, as NVMe takes only whole
    // blocks and its last layers are written last.
    batch_kept.opened += infos[i].pages - known;
    batch_kept.refilled_on_nvme += refills_on_nvme(*seqs[i], infos[i], known);
  }
  const uint64_t held = frames_held();
  // Counting the blocks the batch holds walks its whole context: only when every page kept in
  // memory there is, the batch's own counted as outside HBM, could overflow host memory (the
  // common case, with NVMe and full blocks published, keeps nothing in HBM for them).
  KeptBlocks bound = batch_kept;
  bound.trades = true;
  if (frames_kept_in_memory(bound, /*window=*/0, held) > 0) {
    for (std::size_t i = 0; i < infos.size(); ++i) {
      for (const BlockKey& key : contexts[i].subspan(shared[i])) {
        batch_kept.held += held_block_kept_in_memory(key) && !protected_.contains(key);
      }
    }
    batch_kept.trades = batch_kept.held > 0;
  }
  const auto available_for = [&](uint64_t w) { return frames_available(batch_kept, w, held); };
  if (needed_per_layer > available_for(1)) {
    return layer_does_not_fit(needed_per_layer, available_for(1));
  }
  const uint32_t layers = step.layers;
  uint32_t window = layers;
  if (needed_per_layer * layers > available_for(layers)) {
    // Layer by layer: the computing layer plus `layer_window` loading ahead, as HBM allows. Each
    // layer the window gives up leaves HBM room but puts the batch's pages kept in memory of that
    // layer in host memory (frames_kept_in_memory), so the widest window that fits is searched.
    window = static_cast<uint32_t>(std::min<uint64_t>(
        layers, static_cast<uint64_t>(options_.policies.prefetch.layer_window) + 1));
    while (window > 1 && needed_per_layer * window > available_for(window)) --window;
    step.windowed = true;
  }
  step.window = window;
  step.shared_blocks = std::move(shared);
  step.needed_per_layer = needed_per_layer;
  step.kept = batch_kept;
  return ok_status();
}

uint64_t Scheduler::refills_on_nvme(const Sequence& seq, const StepItemInfo& item,
                                    std::size_t known) const {
  // The blocks open_written_blocks will refill (a prompt block filled whole, its entry referenced
  // by no one) that NVMe holds: taken in use, their NVMe copies keep extents while the step
  // writes them, which blocks in use outside the batch cannot have. Usually none: only with an
  // NVMe tier, and only prompt blocks this step fills whole are looked up.
  if (parts_.nvme == nullptr) return 0;
  const uint64_t tokens_after = item.context_tokens + item.recomputed_tokens + item.new_tokens;
  uint64_t n = 0;
  for (uint64_t b = known; b < item.pages; ++b) {
    if (!fills_prompt_block(b, seq.prompt_keys.size(), tokens_after,
                            options_.geometry.page_tokens)) {
      break;  // those after it are not filled whole either
    }
    const BlockKey& key = seq.prompt_keys[b];
    n += refillable(key) && page_snapshot(key, 0).nvme == CopyState::kReady;
  }
  return n;
}

Status Scheduler::layer_does_not_fit(uint64_t needed_per_layer, uint64_t available) const {
  const uint64_t capacity = parts_.hbm->capacity();
  const std::string in_use = std::to_string(parts_.table->referenced_blocks()) +
                             " blocks in use, " + std::to_string(parts_.table->private_blocks()) +
                             " of them private,";
  const std::string kept =
      nvme_writable()
          ? "hold pages of private blocks, which cannot go to NVMe, and of blocks in use that "
            "NVMe has no room for, which do not fit in host memory: " +
                in_use + " NVMe has room for " + std::to_string(parts_.nvme->in_service()) +
                " blocks; in all " + std::to_string(blocks_kept_in_memory()) + " blocks"
          : "hold pages of blocks in use, which cannot leave memory " +
                std::string(parts_.nvme == nullptr
                                ? "without an NVMe tier"
                                : "while writes to NVMe are paused after failing") +
                " and do not fit in host memory: " + in_use;
  return resource_exhausted(
      "begin_step: one layer of this batch needs " + std::to_string(needed_per_layer) +
      " HBM frames (" + std::to_string(needed_per_layer * options_.geometry.page_bytes()) +
      " bytes) but only " + std::to_string(available) + " of " + std::to_string(capacity) +
      " are available (the rest are reserved by other open steps or hold pinned prefixes: " +
      std::to_string(protected_.size()) + " blocks; or " + kept + " of " +
      std::to_string(options_.geometry.layers) + " pages)");
}

Status Scheduler::open_written_blocks(Step& step, std::span<Sequence* const> seqs) {
  const uint32_t pt = options_.geometry.page_tokens;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    const StepItemInfo& item = step.items[i];
    step.tokens_before.push_back(seq.tokens);
    const uint64_t written = item.recomputed_tokens + item.new_tokens;
    step.first_written.push_back(written == 0 ? item.pages
                                              : static_cast<uint32_t>(seq.tokens / pt));
    const uint64_t tokens_after = seq.tokens + written;
    while (seq.blocks.size() < item.pages) {
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
        for (const BlockKey& made : step.new_blocks) {
          for (Sequence* other : seqs) {
            auto it = std::find(other->blocks.begin(), other->blocks.end(), made);
            if (it != other->blocks.end()) other->blocks.erase(it);
          }
          parts_.table->release(made).status().ignore();
          if (!step.refilled.contains(made)) parts_.table->erase(made).ignore();
        }
        return s.with_context("begin_step");
      }
      if (refill) step.refilled.insert(key);
      facts_[key] = RequestFacts{static_cast<uint32_t>(seq.blocks.size()), seq.reused_blocks,
                                 static_cast<uint32_t>(seq.prompt_keys.size())};
      seq.blocks.push_back(key);
      step.new_blocks.insert(key);
    }
    step.blocks.emplace_back(seq.blocks.begin(), seq.blocks.begin() + item.pages);
  }
  return ok_status();
}

Status Scheduler::plan_first_layers(Step& s) {
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
  return planned;
}

// HBM frames begin_step cannot give a new batch: every layer of each pinned-prefix block (never an
// HBM victim) and each open step's frames per layer x window, pinned or not yet — a step pins its
// frames only as they are granted, so counting pins alone would let two steps each take part of
// HBM and wait on each other until the timeout. A step's frames per layer are its blocks but those
// an earlier item of its batch holds too, and those of pinned prefixes (counted with the prefix).
uint64_t Scheduler::frames_held(StepId except) const {
  uint64_t held = static_cast<uint64_t>(protected_.size()) * options_.geometry.layers;
  for (const auto& [id, step] : steps_) {
    if (id == except) continue;
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
  const bool nvme = nvme_writable();
  const uint64_t all = blocks_kept_in_memory(batch.refilled_on_nvme);
  const uint64_t others = all > batch.held ? all - batch.held : 0;
  const uint64_t outside_window = layers - std::min(layers, window);
  uint64_t pages = others * layers + (batch.held + batch.opened) * outside_window;
  if (!nvme) pages -= std::min(pages, frames_held);
  const uint64_t host = parts_.host->capacity();
  const uint64_t trade_frames = batch.trades ? 1 : 0;
  // Frames reads a hung drive holds (FailedRead) are out of use until it answers.
  const uint64_t unusable = reserve_frames(Tier::kHost) + trade_frames +
                            stats_.host_frames_held.load(std::memory_order_relaxed);
  const uint64_t host_room = host - std::min(host, unusable);
  return pages > host_room ? pages - host_room : 0;
}

uint64_t Scheduler::frames_available(const KeptBlocks& batch, uint64_t window,
                                     uint64_t frames_held) const {
  const uint64_t capacity = parts_.hbm->capacity();
  const uint64_t taken = frames_held + frames_kept_in_memory(batch, window, frames_held);
  return capacity > taken ? capacity - taken : 0;
}

std::string Scheduler::kept_in_memory_because(const BlockKey& key, const Status& why) {
  return "block " + to_string(key) +
         ", which it was admitted beside as bound for NVMe, must stay in memory (" +
         why.to_string() + ")";
}

void Scheduler::fail_steps_that_no_longer_fit(const std::string& what_changed) {
  // Asked as fit_window asked it, beside every other open step and pinned prefix: a step that
  // fitted only while some block in use could go to NVMe waits for frames that only its own end
  // could free.
  for (const auto& [id, step] : steps_) {
    if (step->ended) continue;
    const uint64_t held = frames_held(id);
    const uint64_t needed = step->needed_per_layer * step->window;
    const uint64_t available = frames_available(step->kept, step->window, held);
    if (needed <= available) continue;
    const Status s = unavailable(
        "step " + std::to_string(id) + " no longer fits in HBM: " + what_changed +
        "; its window of " + std::to_string(step->window) + " layers needs " +
        std::to_string(needed) + " HBM frames, " + std::to_string(available) +
        " are left. Abort the step and begin it again: it then fits, or is refused at once");
    for (const auto& ready : step->shared->ready) {
      if (!ready->finished()) ready->fail(s);
    }
    s.ignore();  // told to every layer still waiting, or to none left to tell
  }
}

uint64_t Scheduler::blocks_kept_in_memory(uint64_t extents_taken) const {
  const uint64_t referenced = parts_.table->referenced_blocks();
  if (!nvme_writable()) return referenced;
  const uint64_t private_blocks = parts_.table->private_blocks();
  const uint64_t keyed = referenced - std::min(referenced, private_blocks);
  // Blocks in use that NVMe refused go nowhere below host memory either, nor do the pages left of
  // those that lost one to a failed NVMe read (NVMe takes whole blocks; they stay until every
  // sequence holding the block has recomputed it). Counted as NVMe-bound, they let steps in whose
  // frames never came (the random serving simulation with injected NVMe failures stalled so).
  // Usually none: one lookup each.
  uint64_t refused_in_use = 0;
  for (const auto& [key, tiers] : refused_) {
    const bool by_nvme = (tiers & (1u << tier_index(Tier::kNvme))) != 0;
    refused_in_use += by_nvme && !lost_blocks_.contains(key) && parts_.table->referenced(key);
  }
  for (const BlockKey& key : lost_blocks_) {
    parts_.table
        ->visit(key,
                [&](const EntryView& v) {
                  const bool in_memory = v.copies(Tier::kHbm) + v.copies(Tier::kHost) > 0;
                  refused_in_use += v.refcount() > 0 && in_memory;
                })
        .ignore();
  }
  refused_in_use = std::min(refused_in_use, keyed);
  const uint64_t to_nvme = keyed - refused_in_use;
  const uint64_t capacity = parts_.nvme->in_service();
  const uint64_t extents = capacity - std::min(capacity, extents_taken);
  return private_blocks + refused_in_use + (to_nvme > extents ? to_nvme - extents : 0);
}

uint64_t Scheduler::protected_count(std::span<const BlockKey> keys) const {
  if (protected_.empty()) return 0;
  return static_cast<uint64_t>(std::count_if(
      keys.begin(), keys.end(), [this](const BlockKey& k) { return protected_.contains(k); }));
}

}  // namespace kvtier
