// Scheduler: construction, sequences, match, compute-or-load, hints. See scheduler.hpp.
#include "scheduler/scheduler.hpp"

#include <algorithm>
#include <string>

#include "kvtier/log.hpp"
#include "scheduler/policies/shadowed_first.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerParts& parts,
                                                     const SchedulerOptions& options) {
  if (parts.table == nullptr || parts.port == nullptr || parts.loop == nullptr ||
      parts.hbm == nullptr || parts.host == nullptr) {
    return invalid_argument(
        "scheduler needs a page table, a transfer port, an event loop and the "
        "hbm and host frame allocators");
  }
  if (parts.table->layers() != options.geometry.layers) {
    return invalid_argument("page table has " + std::to_string(parts.table->layers()) +
                            " layers, geometry " + std::to_string(options.geometry.layers));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(parts, options));
  KVTIER_RETURN_IF_ERROR(s->init());
  return s;
}

namespace {

// Pages per batch of HBM<->host copies: 8 MiB of them, from 1 to 1024 pages.
uint32_t copy_batch_pages(uint64_t page_bytes) {
  constexpr uint64_t kBatchBytes = uint64_t{8} << 20;
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(kBatchBytes / std::max<uint64_t>(1, page_bytes), 1, 1024));
}

}  // namespace

Scheduler::Scheduler(const SchedulerParts& parts, const SchedulerOptions& options)
    : parts_(parts),
      options_(options),
      links_(options.max_inflight_bytes, &stats_),
      batcher_(*parts.loop, links_, *parts.port, copy_batch_pages(parts.port->host_page_bytes()),
               [this] { land_demotions(); }),
      resident_pins_(std::make_unique<ResidentPins>()),
      nvme_write_health_(options.nvme_write_pause),
      nvme_read_health_(options.nvme_read_pause) {}

Scheduler::~Scheduler() {
  for (TimerId timer : {nvme_write_resume_timer_, nvme_read_resume_timer_}) {
    if (timer != 0) parts_.loop->cancel_timer(timer);
  }
}

Status Scheduler::init() {
  const auto capacity_of = [&](Tier t) -> uint64_t {
    switch (t) {
      case Tier::kHbm: return parts_.hbm->capacity();
      case Tier::kHost: return parts_.host->capacity();
      case Tier::kNvme: return parts_.nvme != nullptr ? parts_.nvme->capacity() : 0;
    }
    return 0;
  };
  write_ = make_write_strategy(options_.policies.write, options_.policies.write_selective_hits);
  if (write_ == nullptr) return invalid_argument("unknown write policy");
  // Evictors count blocks; memory tiers hold pages, `layers` of them per block.
  std::array<uint64_t, kNumTiers> blocks{};
  uint64_t cache_blocks = 0;
  for (Tier t : kAllTiers) {
    const uint64_t cap = capacity_of(t);
    blocks[tier_index(t)] =
        t == Tier::kNvme ? cap : cap / std::max<uint32_t>(1, options_.geometry.layers);
    cache_blocks += blocks[tier_index(t)];
  }
  std::array<std::optional<EvictorOptions>, kNumTiers> tier_options;
  for (Tier t : kAllTiers) {
    if (t != Tier::kHbm && capacity_of(t) == 0) continue;  // tier not configured
    EvictorOptions& eo = tier_options[tier_index(t)].emplace();
    eo.capacity_blocks = blocks[tier_index(t)];
    eo.cache_blocks = cache_blocks;
    eo.hints = &hints_;
    eo.in_use = [table = parts_.table](const BlockKey& key) { return table->referenced(key); };
  }
  auto tier_evictors = make_tier_evictors(options_.policies.eviction, tier_options);
  std::array<Evictor*, kNumTiers> raw{};
  for (Tier t : kAllTiers) {
    if (!tier_options[tier_index(t)]) continue;
    evictors_[tier_index(t)] = shadowed_first(std::move(tier_evictors[tier_index(t)]), t, *write_);
    if (evictors_[tier_index(t)] == nullptr) {
      return invalid_argument("no eviction policy named " +
                              std::string(eviction_policy_name(options_.policies.eviction)));
    }
    raw[tier_index(t)] = evictors_[tier_index(t)].get();
  }
  admission_ = std::make_unique<NvmeAdmission>(options_.policies.admission);
  placement_ = std::make_unique<Placement>(*parts_.table, raw, *admission_, *write_);
  placement_->set_nvme_refuses(KeyFilter(nvme_refuses_));
  return ok_status();
}

FrameAllocator* Scheduler::frames(Tier tier) const {
  return tier == Tier::kHbm ? parts_.hbm : tier == Tier::kHost ? parts_.host : nullptr;
}

Scheduler::RequestFacts Scheduler::facts_of(const BlockKey& key) const {
  auto it = facts_.find(key);
  return it == facts_.end() ? RequestFacts{} : it->second;
}

bool Scheduler::idle() const {
  if (!transfers_idle() || !ops_.empty() || !staging_waiters_.empty() || !staging_.empty()) {
    return false;
  }
  for (const auto& tier : waiters_) {
    for (const auto& q : tier) {
      if (!q.empty()) return false;
    }
  }
  return true;
}

namespace {

// The states of a block's copies in tier `t`: one per page in HBM and host memory, the extent's
// on NVMe.
std::vector<CopyState> copies_in(const BlockInfo& info, Tier t) {
  if (t == Tier::kNvme) return {info.nvme};
  std::vector<CopyState> out;
  for (const PageInfo& p : info.pages) out.push_back(t == Tier::kHbm ? p.hbm : p.host);
  return out;
}

// "filling, ready, absent, absent".
std::string describe(const std::vector<CopyState>& copies) {
  std::string out;
  for (CopyState c : copies) {
    if (!out.empty()) out += ", ";
    out += copy_state_name(c);
  }
  return out;
}

}  // namespace

Status Scheduler::audit_membership() const {
  std::array<std::size_t, kNumTiers> tracked{};
  for (const auto& [key, info] : parts_.table->snapshot()) {
    for (Tier t : kAllTiers) {
      const Evictor* e = evictor(t);
      if (e == nullptr) continue;
      const std::vector<CopyState> copies = copies_in(info, t);
      const bool ready = std::ranges::count(copies, CopyState::kReady) > 0;
      const bool arriving = std::ranges::count(copies, CopyState::kFilling) > 0;
      const bool in_policy = e->contains(key);
      tracked[tier_index(t)] += in_policy;
      // A block whose pages are still arriving may wait for the last before its tier's policy
      // takes it (a block staged for NVMe, or read up from it, is no victim meanwhile).
      if (in_policy != ready && !(ready && arriving)) {
        return internal_error(
            "block " + to_string(key) + (ready ? " has" : " has no") + " ready copy in " +
            std::string(tier_name(t)) + " but that tier's " + std::string(e->name()) + " evictor " +
            (ready ? "does not track it (it can never be chosen to leave)" : "tracks it") +
            "; its copies there: " + describe(copies));
      }
    }
  }
  for (Tier t : kAllTiers) {
    const Evictor* e = evictor(t);
    if (e != nullptr && e->size() != tracked[tier_index(t)]) {
      return internal_error(std::string(tier_name(t)) + " evictor tracks " +
                            std::to_string(e->size()) + " blocks, but only " +
                            std::to_string(tracked[tier_index(t)]) + " of them are in the table");
    }
  }
  return ok_status();
}

Status Scheduler::audit() const {
  KVTIER_RETURN_IF_ERROR(parts_.table->audit());
  return audit_membership();
}

std::string Scheduler::pending_summary() const {
  std::string out;
  for (Link l : kAllLinks) {
    if (links_.queued_jobs(l) > 0 || links_.inflight_bytes(l) > 0) {
      out += std::string(link_name(l)) + ": " + std::to_string(links_.queued_jobs(l)) +
             " queued, " + std::to_string(links_.inflight_bytes(l)) + " bytes in flight; ";
    }
  }
  std::size_t frame_waiters = staging_waiters_.size();
  for (int t = 0; t < 2; ++t) {
    std::size_t n = 0;
    for (const auto& q : waiters_[t]) n += q.size();
    frame_waiters += n;
    if (n > 0) {
      out += std::to_string(n) + " waiting for " + std::string(tier_name(static_cast<Tier>(t))) +
             " frames; ";
    }
  }
  std::size_t shown = 0;
  for (const auto& [page, op] : ops_) {
    if (shown++ == 4) {
      out += "...; ";
      break;
    }
    out += std::string(op->drain ? "drain " : "fill ") + std::string(tier_name(page.tier)) + " " +
           to_string(page.key) + " layer " + std::to_string(page.layer) + " (" +
           std::to_string(op->waiters.size()) + " waiting); ";
  }
  if (!ops_.empty()) out += std::to_string(ops_.size()) + " copies in flight; ";
  if (!out.empty()) {
    // Who holds host memory: the usual reason a request waits for a host frame.
    uint64_t priv = 0, referenced_split = 0, referenced_whole = 0, cached = 0, in_flight = 0;
    for (const auto& [key, info] : parts_.table->snapshot()) {
      uint64_t host = 0, hbm_only = 0;
      for (const PageInfo& p : info.pages) {
        host += p.host != CopyState::kAbsent;
        hbm_only += p.host == CopyState::kAbsent && p.hbm == CopyState::kReady;
        in_flight += p.host == CopyState::kFilling || p.host == CopyState::kDraining;
      }
      if (host == 0) continue;
      if (key.is_private()) {
        priv += host;
      } else if (info.refcount > 0) {
        (hbm_only > 0 ? referenced_split : referenced_whole) += host;
      } else {
        cached += host;
      }
    }
    out += "host frames: " + std::to_string(priv) + " private, " +
           std::to_string(referenced_whole) + " in use (whole), " +
           std::to_string(referenced_split) + " in use (split with hbm), " +
           std::to_string(cached) + " cached, " + std::to_string(in_flight) + " in flight, " +
           std::to_string(parts_.table->held_frames(Tier::kHost)) + " held by abandoned reads, " +
           std::to_string(parts_.host->free_count()) + " free; ";
    // And who holds HBM: pages pinned by steps, other pages of blocks in use, cached pages.
    uint64_t pinned = 0, hbm_priv = 0, hbm_used = 0, hbm_cached = 0, hbm_moving = 0;
    for (const auto& [key, info] : parts_.table->snapshot()) {
      for (const PageInfo& p : info.pages) {
        if (p.hbm == CopyState::kAbsent) continue;
        if (p.hbm != CopyState::kReady) {
          ++hbm_moving;
        } else if (p.pins > 0) {
          ++pinned;
        } else if (key.is_private()) {
          ++hbm_priv;
        } else {
          ++(info.refcount > 0 ? hbm_used : hbm_cached);
        }
      }
    }
    out += "hbm frames: " + std::to_string(pinned) + " pinned, " + std::to_string(hbm_priv) +
           " private, " + std::to_string(hbm_used) + " in use, " + std::to_string(hbm_cached) +
           " cached, " + std::to_string(hbm_moving) + " filling or draining, " +
           std::to_string(parts_.hbm->free_count()) + " free";
    // Private pages (blocks an open sequence filled that the engine never published under a
    // content key) can live only in HBM and host memory: NVMe is addressed by content key. When
    // they fill host memory while requests wait for frames, no move the scheduler can plan frees
    // one; only the engine can, and the hint says how.
    const uint64_t host_capacity = parts_.host->capacity();
    if (frame_waiters > 0 && host_capacity > 0 && 2 * priv >= host_capacity &&
        parts_.host->free_count() <= reserve_frames(Tier::kHost)) {
      out += "; private pages hold " + std::to_string(priv) + " of the " +
             std::to_string(host_capacity) +
             " host frames: they cannot go to NVMe (it is addressed by content key), so only the "
             "engine can free them: publish full blocks (StepCompletion::full_block_keys at "
             "end_step), close sequences, or give host memory more frames";
    }
  }
  return out.empty() ? "idle" : out;
}

// ---------------------------------------------------------------------------------------------
// Match and sequences
// ---------------------------------------------------------------------------------------------

MatchResult Scheduler::match(std::span<const BlockKey> keys) const {
  return parts_.table->match(keys, MatchOptions{.record_hits = false, .acquire = false});
}

MatchResult Scheduler::match_and_count(std::span<const BlockKey> keys) {
  MatchResult m = parts_.table->match(keys, MatchOptions{.record_hits = true, .acquire = false});
  const uint64_t pt = options_.geometry.page_tokens;
  stats_.lookup_blocks.fetch_add(keys.size(), std::memory_order_relaxed);
  stats_.lookup_tokens.fetch_add(keys.size() * pt, std::memory_order_relaxed);
  for (Tier t : kAllTiers) {
    stats_.hit_blocks[tier_index(t)].fetch_add(m.by_tier[tier_index(t)], std::memory_order_relaxed);
    stats_.hit_tokens[tier_index(t)].fetch_add(m.by_tier[tier_index(t)] * pt,
                                               std::memory_order_relaxed);
  }
  return m;
}

Nanos Scheduler::estimated_load_time(Tier from, uint32_t blocks) const {
  if (from == Tier::kHbm) return 0;
  // Host -> HBM for every tier below HBM; NVMe -> host first for NVMe. The bytes in flight on a
  // link delay this load too, and so do those queued at the priority its copies take there or
  // above: a sequence just opened reads from NVMe at kAdmitted, ahead of the reads hints queued
  // for requests still waiting, and loads into HBM at kPrefetch.
  const auto over = [&](Link link, uint64_t block_bytes, TransferPriority prio) {
    const LinkModel m = parts_.port->link_model(link);
    return m.transfer_time(blocks * block_bytes + links_.queued_bytes_ahead(link, prio) +
                           links_.inflight_bytes(link));
  };
  Nanos t = over(Link::kHostToHbm, host_block_bytes(), TransferPriority::kPrefetch);
  if (from == Tier::kNvme) {
    t += over(Link::kNvmeToHost, nvme_block_bytes(), TransferPriority::kAdmitted);
  }
  return t;
}

void Scheduler::decide_reuse(std::span<const BlockKey> keys, const MatchResult& match,
                             Sequence& seq, OpenedSequence& out) {
  // Where each matched block must be loaded from.
  std::vector<Tier> from;
  from.reserve(match.blocks);
  for (uint32_t i = 0; i < match.blocks; ++i) {
    auto info = parts_.table->lookup(keys[i]);
    from.push_back(info.ok() && info->match_tier ? *info->match_tier : Tier::kNvme);
  }
  // Compute-or-load: reuse the prefix [0, k) that saves the most time, where block i saves its
  // recompute time minus its load time. A block slower to load than to recompute is never loaded
  // just for itself; it is loaded only when cheaper blocks after it make the prefix worth it.
  const double prefill = std::max(1.0, options_.policies.prefill_tokens_per_s);
  const Nanos recompute_block =
      static_cast<Nanos>(static_cast<double>(options_.geometry.page_tokens) / prefill * 1e9);
  const LinkModel h2d = parts_.port->link_model(Link::kHostToHbm);
  const LinkModel nvme = parts_.port->link_model(Link::kNvmeToHost);
  const uint64_t bb = host_block_bytes();
  // Per-block cost at the links' bandwidth; their fixed latency overlaps across a batch of loads.
  const auto load_time = [&](Tier t) -> Nanos {
    switch (t) {
      case Tier::kHbm: return 0;
      case Tier::kHost: return h2d.transfer_time(bb) - h2d.latency;
      case Tier::kNvme:
        return h2d.transfer_time(bb) - h2d.latency + nvme.transfer_time(nvme_block_bytes()) -
               nvme.latency;
    }
    return 0;
  };
  // Work already queued on a link delays this load once, however many blocks it moves.
  const Nanos h2d_backlog = estimated_load_time(Tier::kHost, 0);
  const Nanos nvme_backlog = estimated_load_time(Tier::kNvme, 0) - h2d_backlog;
  int64_t best_saving = 0;
  uint32_t best_k = 0;
  int64_t saving = 0;
  bool uses_h2d = false;
  bool uses_nvme = false;
  // While reads from NVMe are paused (a failing disk), the prefix ends before the first block
  // found only there.
  for (uint32_t i = 0; i < match.blocks; ++i) {
    if (from[i] == Tier::kNvme && !nvme_readable()) break;
    saving += recompute_block - load_time(from[i]);
    uses_h2d = uses_h2d || from[i] != Tier::kHbm;
    uses_nvme = uses_nvme || from[i] == Tier::kNvme;
    const int64_t net = saving - (uses_h2d ? h2d_backlog : 0) - (uses_nvme ? nvme_backlog : 0);
    if (net >= best_saving) {
      best_saving = net;
      best_k = i + 1;
    }
  }
  out.matched_blocks = match.blocks;
  out.reused_blocks = best_k;
  out.recompute_blocks = match.blocks - best_k;
  out.reused_tokens = static_cast<uint64_t>(best_k) * options_.geometry.page_tokens;
  for (uint32_t i = 0; i < best_k; ++i) out.reused_by_tier[tier_index(from[i])] += 1;
  if (out.recompute_blocks > 0) {
    stats_.recompute_blocks.fetch_add(out.recompute_blocks, std::memory_order_relaxed);
    stats_.recompute_tokens.fetch_add(
        static_cast<uint64_t>(out.recompute_blocks) * options_.geometry.page_tokens,
        std::memory_order_relaxed);
  }
  seq.reused_blocks = best_k;
}

Result<OpenedSequence> Scheduler::open_sequence(std::span<const BlockKey> prompt_keys) {
  for (const BlockKey& k : prompt_keys) {
    if (k.is_private() || k.is_null()) {
      return invalid_argument("open_sequence: key " + to_string(k) +
                              " is not a content key (private or null)");
    }
  }
  // Blocks a dead drive took are forgotten before the prompt is matched: reused, each would fail
  // its read (the drive is found out on an I/O thread, and the loop hears of it only with a
  // transfer's callback, after whatever ran meanwhile).
  take_retired_nvme_extents();
  auto seq = std::make_unique<Sequence>();
  seq->id = ++next_sequence_;
  seq->prompt_keys.assign(prompt_keys.begin(), prompt_keys.end());
  OpenedSequence out;
  out.id = seq->id;
  out.prompt_blocks = static_cast<uint32_t>(prompt_keys.size());
  const MatchResult m = match_and_count(prompt_keys);
  decide_reuse(prompt_keys, m, *seq, out);
  // Take references on the reused prefix. A block can vanish between match and here only through
  // an eviction run by this same loop, which has not run since; still, stop at the first failure.
  for (uint32_t i = 0; i < out.reused_blocks; ++i) {
    const Result<HintedCopies> hinted = parts_.table->acquire_for_reuse(prompt_keys[i]);
    if (!hinted.ok()) {
      out.reused_blocks = i;
      out.reused_tokens = static_cast<uint64_t>(i) * options_.geometry.page_tokens;
      break;
    }
    if (hinted->hbm) {
      stats_.hinted_loads_reused[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
    }
    if (hinted->host) {
      stats_.hinted_loads_reused[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
    }
    seq->blocks.push_back(prompt_keys[i]);
  }
  // Tell the policies what this request used and what it missed, in chain order.
  // Every tier's policy hears of every reference: an access where it holds a copy, a miss where it
  // does not (so each tier learns the reuse pattern, not only the tiers that happened to keep the
  // block).
  for (uint32_t i = 0; i < prompt_keys.size(); ++i) {
    const BlockKey& key = prompt_keys[i];
    if (i < out.reused_blocks) facts_[key].depth = i;
    BlockFacts facts;
    facts.key = key;
    facts.parent = i > 0 ? prompt_keys[i - 1] : BlockKey{};
    facts.depth = i;
    facts.request_hit_blocks = out.reused_blocks;
    facts.request_blocks = static_cast<uint32_t>(prompt_keys.size());
    for (const auto& e : evictors_) {
      if (e == nullptr) continue;
      if (i < out.reused_blocks && e->contains(key)) {
        e->on_access(key);
      } else {
        e->on_miss(facts);
      }
    }
  }
  seq->tokens = out.reused_tokens;
  seq->reused_blocks = out.reused_blocks;
  // Start bringing the reused prefix up: NVMe -> host -> HBM, as prefetches (a step that needs a
  // page first promotes its load to a demand).
  bool hbm_room = true;
  for (const BlockKey& key : seq->blocks) {
    hbm_room = prefetch_block(key, PrefetchFor::kOpenSequence, hbm_room);
  }
  stats_.sequences_opened.fetch_add(1, std::memory_order_relaxed);
  sequences_.emplace(seq->id, std::move(seq));
  store_gauges();
  return out;
}

Result<Scheduler::Sequence*> Scheduler::find_sequence(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return not_found("sequence " + std::to_string(id) + " is not open (never opened, or closed)");
  }
  return it->second.get();
}

Status Scheduler::close_sequence(SequenceId id, std::optional<uint64_t> generated_tokens) {
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, find_sequence(id));
  if (seq->active_step != 0) {
    return failed_precondition("sequence " + std::to_string(id) + " is in step " +
                               std::to_string(seq->active_step) + "; end the step first");
  }
  Status first;
  for (PendingPublish& p : pending_publish_) {
    if (p.sequence == id) p.orphaned = true;
  }
  // What the request was, for policies that learn from it: its chain and how much it generated.
  if (generated_tokens) {
    for (const auto& e : evictors_) {
      if (e != nullptr) e->on_request_end(seq->blocks, *generated_tokens);
    }
  }
  for (const BlockKey& key : seq->blocks) {
    const bool pending =
        std::any_of(pending_publish_.begin(), pending_publish_.end(),
                    [&](const PendingPublish& p) { return p.orphaned && p.private_key == key; });
    if (pending) continue;  // full and valid: it is published once its transfers end
    Status released = release_sequence_block(key);
    if (!released.ok() && first.ok()) first = released;
  }
  sequences_.erase(id);
  store_gauges();
  for (Tier t : {Tier::kHbm, Tier::kHost}) serve_frame_waiters(t);
  return first;
}

Status Scheduler::release_sequence_block(const BlockKey& key) {
  KVTIER_ASSIGN_OR_RETURN(const uint32_t left, parts_.table->release(key));
  if (left == 0) lost_blocks_.erase(key);  // no sequence left to recompute it
  Status first;
  if (key.is_private()) {
    // A private block has no identity anyone can match: its K/V goes with the sequence.
    for (Tier t : {Tier::kHbm, Tier::kHost}) {
      auto dropped = parts_.table->drop_all(key, t);
      if (!dropped.ok() && first.ok()) first = dropped.status();
    }
  }
  after_change(key);
  return first;
}

Status Scheduler::hint(std::span<const HintedRequest> waiting) {
  // Replace the board: requests no longer hinted have started or were dropped.
  std::unordered_set<uint64_t> now;
  for (const HintedRequest& r : waiting) now.insert(r.request_id);
  hints_.retain([&](uint64_t id) { return now.contains(id); });
  uint32_t rank = 0;
  bool hbm_room = true;
  for (const HintedRequest& r : waiting) {
    KVTIER_RETURN_IF_ERROR(
        hints_.update(r.request_id, static_cast<uint64_t>(r.expected_start_ns), r.keys));
    // Prefetch the cached prefix of the first `depth` waiting requests toward host memory, and
    // into HBM where it has room to spare (prefetch_block).
    if (rank++ < options_.policies.prefetch.depth) {
      const MatchResult m = parts_.table->match(r.keys, MatchOptions{.record_hits = false});
      for (uint32_t i = 0; i < m.blocks; ++i) {
        hbm_room = prefetch_block(r.keys[i], PrefetchFor::kWaitingRequest, hbm_room);
      }
    }
  }
  return ok_status();
}

Status Scheduler::adopt_nvme_block(const BlockKey& key) {
  if (parts_.nvme == nullptr) return failed_precondition("no nvme tier is configured");
  KVTIER_RETURN_IF_ERROR(parts_.table->create_block(key, BlockKey{}));
  auto extent = parts_.table->begin_fill(key, CopyId::nvme());
  if (!extent.ok()) {
    parts_.table->erase(key).ignore();
    return extent.status();
  }
  KVTIER_RETURN_IF_ERROR(parts_.table->complete_fill(key, CopyId::nvme()));
  sync_membership(key, Tier::kNvme);
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Prefix pins and persistence
// ---------------------------------------------------------------------------------------------

Result<uint64_t> Scheduler::pin_prefix(std::span<const BlockKey> keys, Nanos ttl) {
  if (keys.empty()) return invalid_argument("pin_prefix with no keys");
  if (ttl <= 0) return invalid_argument("pin_prefix: ttl must be > 0");
  const MatchResult m = parts_.table->match(keys, MatchOptions{.record_hits = false});
  if (m.blocks < keys.size()) {
    return not_found("pin_prefix: block " + std::to_string(m.blocks) + " (" +
                     to_string(keys[m.blocks]) + ") of the prefix is not cached");
  }
  uint64_t added = 0;
  std::unordered_set<BlockKey, BlockKeyHash> distinct;
  for (const BlockKey& k : keys) {
    if (distinct.insert(k).second && !protected_.contains(k)) ++added;
  }
  const uint64_t layers = options_.geometry.layers;
  const uint64_t quota = static_cast<uint64_t>(options_.policies.pin_quota *
                                               static_cast<double>(parts_.hbm->capacity()));
  const uint64_t after = (protected_.size() + added) * layers;
  if (after > quota) {
    return resource_exhausted("pin_prefix: " + std::to_string(protected_.size() + added) +
                              " pinned blocks would need " + std::to_string(after) +
                              " HBM frames; policies.pin_quota allows " + std::to_string(quota) +
                              " of " + std::to_string(parts_.hbm->capacity()));
  }
  // Open steps were admitted against the frames pins left them (frames_held): a pin that would
  // take frames they were promised could leave their loads waiting for frames that never come.
  const uint64_t capacity = parts_.hbm->capacity();
  std::vector<BlockKey> fresh;
  for (const BlockKey& k : distinct) {
    if (protected_.emplace(k, 0).second) fresh.push_back(k);
  }
  const uint64_t held = frames_held();
  for (const BlockKey& k : fresh) protected_.erase(k);
  if (held > capacity) {
    return resource_exhausted("pin_prefix: " + std::to_string(fresh.size()) +
                              " more pinned blocks and the open steps would need " +
                              std::to_string(held) + " HBM frames of " + std::to_string(capacity) +
                              "; pin again once those steps have ended");
  }
  PrefixPin pin;
  for (const BlockKey& k : distinct) {
    Status s = parts_.table->acquire(k);
    if (!s.ok()) {
      for (const BlockKey& taken : pin.keys) {
        parts_.table->release(taken).status().ignore();
        if (--protected_[taken] == 0) protected_.erase(taken);
      }
      return s.with_context("pin_prefix");
    }
    pin.keys.push_back(k);
    protected_[k] += 1;
  }
  const uint64_t id = ++next_pin_;
  // Bring the pinned blocks into HBM; they are never HBM victims while pinned.
  for (const BlockKey& k : pin.keys) {
    for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
      ensure_in_hbm(k, l, TransferPriority::kPrefetch, nullptr,
                    [](const Status& s) { s.ignore(); });
    }
  }
  pin.timer = parts_.loop->post_after(ttl, [this, id] { unpin_prefix(id).ignore(); });
  prefix_pins_.emplace(id, std::move(pin));
  store_gauges();
  return id;
}

void Scheduler::store_gauges() {
  stats_.open_sequences.store(sequences_.size(), std::memory_order_relaxed);
  stats_.pinned_prefix_blocks.store(protected_.size(), std::memory_order_relaxed);
}

Status Scheduler::unpin_prefix(uint64_t id) {
  auto it = prefix_pins_.find(id);
  if (it == prefix_pins_.end()) {
    return not_found("prefix pin " + std::to_string(id) + " does not exist (unpinned, or expired)");
  }
  PrefixPin pin = std::move(it->second);
  prefix_pins_.erase(it);
  parts_.loop->cancel_timer(pin.timer);
  for (const BlockKey& k : pin.keys) {
    if (--protected_[k] == 0) protected_.erase(k);
    parts_.table->release(k).status().ignore();
    after_change(k);
  }
  store_gauges();
  want_watermark_check();
  // Its HBM pages are victims again: a request waiting for a frame may take one now.
  serve_memory_waiters();
  return ok_status();
}

uint64_t Scheduler::persist_to_nvme() {
  if (parts_.nvme == nullptr) return 0;
  if (!nvme_writable()) {
    log(LogLevel::kWarn, "persist: nothing is written, writes to NVMe are paused after failing");
    return 0;
  }
  uint64_t started = 0;
  for (const auto& [key, info] : parts_.table->snapshot()) {
    if (key.is_private() || info.nvme != CopyState::kAbsent || !info.match_tier) continue;
    const bool all_host = std::all_of(info.pages.begin(), info.pages.end(), [](const PageInfo& p) {
      return p.host == CopyState::kReady;
    });
    if (all_host) {
      demote_block_to_nvme(key, TransferPriority::kWriteBack, /*keep_host=*/true);
    } else {
      write_through(key, TierMask::of(Tier::kHost).with(Tier::kNvme));
    }
    ++started;
  }
  return started;
}

}  // namespace kvtier
