#include "scheduler/policies/lookahead_evictor.hpp"

#include <algorithm>
#include <bit>
#include <optional>

#include "scheduler/policies/chain_walk.hpp"
#include "scheduler/policies/hint_board.hpp"

namespace kvtier {
namespace {

// The frames the ghost is measured in: the whole cache's.
uint64_t span_of(const EvictorOptions& options) {
  return std::max<uint64_t>({options.capacity_blocks, options.cache_blocks, 1});
}

// The model's horizon: turnovers of the whole cache for the last tier (or a tier alone), of the
// tier itself for a tier above the last (one that reads its history from the last).
uint64_t horizon_of(const EvictorOptions& options, bool above_last) {
  const uint64_t frames =
      above_last ? std::max<uint64_t>(options.capacity_blocks, 1) : span_of(options);
  return LookaheadEvictor::kHorizonCapacities * frames;
}

constexpr uint32_t kFirstUse = 0;  // the kind of a first use whose request is open
constexpr uint32_t kFirstReused = LookaheadEvictor::kOutputBuckets + 1;  // the kind of 2-3 uses

// A class with little evidence ranks like the class of half its uses (same ended flag): a first
// use of a known output bucket, or a block of 2-3 uses, like every first use; one use has none.
std::vector<uint32_t> class_fallbacks() {
  std::vector<uint32_t> f(LookaheadEvictor::kClasses, ReuseModel::kNoFallback);
  for (uint32_t c = 2; c < LookaheadEvictor::kClasses; ++c) {
    const uint32_t kind = c / 2;
    f[c] = 2 * (kind <= kFirstReused ? kFirstUse : kind - 1) + c % 2;
  }
  return f;
}

// Every first use counts in the estimate of the first-use class, whatever its output bucket.
std::vector<uint32_t> class_pools() {
  std::vector<uint32_t> p(LookaheadEvictor::kClasses, ReuseModel::kNoFallback);
  for (uint32_t kind = 1; kind <= LookaheadEvictor::kOutputBuckets; ++kind) {
    for (uint32_t ended = 0; ended < 2; ++ended) p[2 * kind + ended] = 2 * kFirstUse + ended;
  }
  return p;
}

uint32_t saturating_increment(uint32_t v) { return v == UINT32_MAX ? v : v + 1; }

}  // namespace

LookaheadEvictor::LookaheadEvictor(const EvictorOptions& options, const LookaheadEvictor* history)
    : hints_(options.hints),
      in_use_(options.in_use),
      history_(history),
      index_(options.expected_blocks),
      ghost_(history != nullptr
                 ? 0
                 : std::clamp<uint64_t>(
                       std::min(span_of(options), kMaxGhost / kGhostFactor) * kGhostFactor,
                       kMinGhost, kMaxGhost)),
      model_(kClasses, horizon_of(options, history != nullptr),
             kHalfLifeHorizons * horizon_of(options, history != nullptr), class_fallbacks(),
             class_pools()) {}

uint32_t LookaheadEvictor::class_of(uint32_t uses, bool ended) {
  const uint32_t kind =
      uses <= 1
          ? kFirstUse
          : kOutputBuckets + std::min<uint32_t>(kUseBuckets - 1,
                                                static_cast<uint32_t>(std::bit_width(uses)) - 1);
  return 2 * kind + (ended ? 1 : 0);
}

uint32_t LookaheadEvictor::class_after(uint32_t uses,
                                       const std::optional<GhostTable::Entry>& remembered,
                                       bool ended) {
  if (uses <= 1 && remembered && remembered->tag / 2 <= kOutputBuckets) {
    return 2 * (remembered->tag / 2) + (ended ? 1 : 0);
  }
  return class_of(uses, ended);
}

uint32_t LookaheadEvictor::first_use_class(uint64_t output_tokens, bool ended) {
  uint32_t bucket = 0;
  while (bucket < kOutputBounds.size() && output_tokens >= kOutputBounds[bucket]) ++bucket;
  return 2 * (1 + bucket) + (ended ? 1 : 0);
}

bool LookaheadEvictor::hinted(const BlockKey& key) const {
  return (hints_ != nullptr && hints_->contains(key)) || (in_use_ && in_use_(key));
}

void LookaheadEvictor::tick() {
  ++now_;
  model_.advance(now_);
}

std::optional<GhostTable::Entry> LookaheadEvictor::recall(const BlockKey& key) const {
  if (const uint32_t slot = index_.find(key); slot != KeyIndex::kNone) {
    return GhostTable::Entry{ref_time_[slot], uses_[slot], class_[slot]};
  }
  return recall_untracked(key);
}

std::optional<GhostTable::Entry> LookaheadEvictor::recall_untracked(const BlockKey& key) const {
  if (history_ == nullptr) return ghost_.find(key, now_);
  std::optional<GhostTable::Entry> e = history_->recall(key);
  if (!e) return e;
  // The tiers' clocks agree (each hears every reference); one that fell behind through a
  // caller's misuse must not see a reference in its future.
  e->time = std::min(e->time, now_);
  // This tier hears a reference before the last tier: a request's end it settled just now is
  // not in the history yet (the same block referenced next, as a new request's first block).
  if (key == ended_key_ && e->time == ended_time_) e->tag |= 1u;
  return e;
}

void LookaheadEvictor::remember(const BlockKey& key, const GhostTable::Entry& entry) {
  if (history_ == nullptr) ghost_.put(key, entry, now_);
}

void LookaheadEvictor::remember_class(const BlockKey& key, uint32_t cls) {
  if (history_ == nullptr) ghost_.set_tag(key, static_cast<uint8_t>(cls));
}

void LookaheadEvictor::remember_ended(const BlockKey& key, const GhostTable::Entry& entry) {
  if (history_ == nullptr) {
    ghost_.set_tag(key, static_cast<uint8_t>(entry.tag | 1u));
    return;
  }
  ended_key_ = key;
  ended_time_ = entry.time;
}

uint32_t LookaheadEvictor::list_for(uint32_t cls, uint32_t parent_slot) const {
  // A parent the queue will read is no reason to hold its child back.
  if (parent_slot == KeyIndex::kNone || list_[parent_slot] == kHintedList) return cls;
  const uint32_t parent_cls = rank_class(parent_slot);
  return model_.expected_gap(parent_cls) > model_.expected_gap(cls) ? parent_cls : cls;
}

std::optional<CarriedRank> LookaheadEvictor::arrival_rank(const BlockFacts& block) {
  if (!block.demoted || !block.rank || block.rank->cls >= kClasses) return std::nullopt;
  return block.rank;
}

void LookaheadEvictor::insert_ranked(uint32_t list, uint32_t slot) {
  if (list < kArrivedLists) return lists_.push_front(list, slot);
  // Behind every block that ranks from a later time, or from the same time (one run) and is
  // shallower: a chain leaves from its tail whatever order its blocks arrive in.
  std::set<ArrivalKey>& order = arrival_order_[list - kArrivedLists];
  const ArrivalKey key = arrival_key(slot);
  const auto behind = order.upper_bound(key);  // the first block that ranks after this one
  order.emplace_hint(behind, key);
  if (behind == order.end()) return lists_.push_back(list, slot);
  const uint32_t newer = lists_.newer(behind->slot);
  if (newer == SlotLists::kNil) return lists_.push_front(list, slot);
  lists_.insert_older_than(list, newer, slot);
}

void LookaheadEvictor::unlink(uint32_t slot) {
  const uint32_t list = list_[slot];
  lists_.remove(list, slot);
  if (list >= kArrivedLists && list < kRankLists) {
    arrival_order_[list - kArrivedLists].erase(arrival_key(slot));
  }
}

void LookaheadEvictor::hold(uint32_t slot) {
  const uint32_t cls = rank_class(slot);
  unlink(slot);
  held_class_[slot] = static_cast<uint8_t>(cls);
  list_[slot] = static_cast<uint8_t>(kHeldList);
  lists_.push_front(kHeldList, slot);
  if (last_placed_ == slot) last_placed_ = KeyIndex::kNone;
}

void LookaheadEvictor::release(uint32_t slot) {
  lists_.remove(kHeldList, slot);
  list_[slot] = static_cast<uint8_t>(kArrivedLists + held_class_[slot]);
  insert_ranked(list_[slot], slot);
}

void LookaheadEvictor::place(uint32_t slot, uint64_t time) {
  const uint32_t ps = links_.parent_slot(index_, slot);
  place_in(slot, list_for(class_[slot], ps), ps, time);
}

void LookaheadEvictor::place_in(uint32_t slot, uint32_t list, uint32_t parent_slot, uint64_t time) {
  list_[slot] = static_cast<uint8_t>(list);
  const bool behind_parent =
      parent_slot != KeyIndex::kNone && parent_slot == last_placed_ && list_[parent_slot] == list;
  rank_time_[slot] = behind_parent ? rank_time_[parent_slot] : time;
  if (behind_parent && list < kArrivedLists) {
    lists_.insert_older_than(list, parent_slot, slot);
  } else {
    insert_ranked(list, slot);  // an arrived list puts a child behind its parent by depth
  }
  last_placed_ = slot;
}

void LookaheadEvictor::settle_pending(const BlockKey& parent) {
  if (pending_.is_null()) return;
  const BlockKey previous = pending_;
  pending_ = BlockKey{};
  if (!parent.is_null() && parent == previous) return;  // continued by its child
  const uint32_t slot = index_.find(previous);
  if (slot != KeyIndex::kNone) {
    if ((class_[slot] & 1u) == 0) reclass(slot, class_[slot] | 1u);
    return;
  }
  if (const auto e = recall_untracked(previous); e && (e->tag & 1u) == 0) {
    model_.moved(e->tag, e->tag | 1u, e->time);
    remember_ended(previous, *e);
  }
}

void LookaheadEvictor::reclass(uint32_t slot, uint32_t to) {
  model_.moved(class_[slot], to, ref_time_[slot]);
  class_[slot] = static_cast<uint8_t>(to);
  if (list_[slot] >= kHintedList) return;  // ranked again when it leaves that list
  const uint32_t list = list_for(to, links_.parent_slot(index_, slot)) +
                        (list_[slot] >= kArrivedLists ? kArrivedLists : 0);
  if (list != list_[slot]) {
    unlink(slot);
    list_[slot] = static_cast<uint8_t>(list);
    insert_ranked(list, slot);
  }
}

void LookaheadEvictor::on_request_end(std::span<const BlockKey> keys, uint64_t output_tokens) {
  // Deepest first: each block moved to the front of a class list goes in front of its children,
  // so the chain still leaves from its tail.
  for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
    const BlockKey& key = *it;
    if (key.is_null()) continue;
    if (const uint32_t slot = index_.find(key); slot != KeyIndex::kNone) {
      if (class_[slot] / 2 == kFirstUse) {
        reclass(slot, first_use_class(output_tokens, (class_[slot] & 1u) != 0));
      }
      continue;
    }
    const std::optional<GhostTable::Entry> e = recall_untracked(key);
    if (!e || e->tag / 2 != kFirstUse) continue;
    const uint32_t to = first_use_class(output_tokens, (e->tag & 1u) != 0);
    model_.moved(e->tag, to, e->time);
    remember_class(key, to);
  }
}

void LookaheadEvictor::note_reference(const BlockKey& parent, const BlockKey& key) {
  if (parent.is_null() || parent != last_reference_) run_start_ = now_;
  last_reference_ = key;
}

void LookaheadEvictor::on_miss(const BlockFacts& block) {
  tick();
  note_reference(block.parent, block.key);
  if (index_.find(block.key) != KeyIndex::kNone) return;  // present here: not a miss
  settle_pending(block.parent);
  uint32_t uses = 1;
  if (const auto e = recall_untracked(block.key); e) {
    model_.reused(e->tag, now_ - e->time);
    uses = saturating_increment(e->count);
  }
  const uint32_t cls = class_of(uses, false);
  model_.entered(cls);
  remember(block.key, GhostTable::Entry{now_, uses, static_cast<uint8_t>(cls)});
  pending_ = block.key;
}

void LookaheadEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  const uint32_t limit = index_.slot_limit();
  lists_.reserve_slots(limit);
  links_.reserve_slots(limit);
  if (rank_time_.size() < limit) {
    rank_time_.resize(limit, 0);
    ref_time_.resize(limit, 0);
    uses_.resize(limit, 0);
    class_.resize(limit, 0);
    list_.resize(limit, 0);
    held_class_.resize(limit, 0);
    depth_.resize(limit, 0);
  }
  // The interval this tier has open for the block (from its last reference here, or the miss
  // just recorded) goes on; a block it never saw opens one. A block demoted with the rank of the
  // tier above keeps that rank (one order over the hierarchy); any other ranks from its arrival:
  // a block computed or promoted into this tier is wanted now. Either brings its hit count.
  // (The slot is new: what is known of the block comes from before it arrived.)
  const std::optional<GhostTable::Entry> remembered = recall_untracked(block.key);
  if (remembered && history_ == nullptr) ghost_.take(block.key, now_);
  const uint32_t uses =
      std::max<uint32_t>({remembered ? remembered->count : 0u, block.hits + 1u, 1u});
  uint32_t cls;
  if (remembered) {
    cls = class_after(uses, remembered, (remembered->tag & 1u) != 0);
    if (cls != remembered->tag) model_.moved(remembered->tag, cls, remembered->time);
    ref_time_[slot] = remembered->time;
  } else {
    cls = class_of(uses, false);
    model_.entered(cls);
    ref_time_[slot] = now_;
  }
  uses_[slot] = uses;
  class_[slot] = static_cast<uint8_t>(cls);
  depth_[slot] = block.depth;
  links_.attach(index_, slot, block.parent);
  if (const std::optional<CarriedRank> carried = arrival_rank(block)) {
    place_in(slot, kArrivedLists + carried->cls, links_.parent_slot(index_, slot), carried->time);
  } else {
    place(slot, placement_time(block.key));
  }
}

void LookaheadEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  tick();
  note_reference(links_.parent(slot), key);
  settle_pending(links_.parent(slot));
  model_.reused(class_[slot], now_ - ref_time_[slot]);
  uses_[slot] = saturating_increment(uses_[slot]);
  const uint32_t cls = class_of(uses_[slot], false);
  model_.entered(cls);
  class_[slot] = static_cast<uint8_t>(cls);
  ref_time_[slot] = now_;
  unlink(slot);
  place(slot, run_start_);
  pending_ = key;
}

void LookaheadEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  remember(key, GhostTable::Entry{ref_time_[slot], uses_[slot], class_[slot]});
  const uint32_t parent = links_.parent_slot(index_, slot);
  links_.detach(index_, slot);
  unlink(slot);
  if (last_placed_ == slot) last_placed_ = KeyIndex::kNone;
  index_.erase(slot);
  if (parent != KeyIndex::kNone && list_[parent] == kHeldList && links_.children(parent) == 0) {
    release(parent);
  }
}

void LookaheadEvictor::unhint(uint32_t slot) {
  lists_.remove(kHintedList, slot);
  const uint32_t list = list_for(class_[slot], links_.parent_slot(index_, slot));
  list_[slot] = static_cast<uint8_t>(list);
  rank_time_[slot] = now_;
  lists_.push_front(list, slot);
  if (last_placed_ == slot) last_placed_ = KeyIndex::kNone;
}

void LookaheadEvictor::on_released(const BlockKey& key) {
  // Its sequence closed: ranked again now, wherever it waits in the hinted list (found lazily at
  // the list's back, it would wait behind every block a longer-lived sequence holds).
  const uint32_t slot = index_.find(key);
  if (slot != KeyIndex::kNone && list_[slot] == kHintedList && !hinted(key)) unhint(slot);
}

uint32_t LookaheadEvictor::best_tail() {
  // A block no waiting request reads any more (its request started without reaching it, or was
  // cancelled) leaves the hinted list as if touched now.
  for (uint32_t h = lists_.back(kHintedList); h != SlotLists::kNil && !hinted(index_.key(h));
       h = lists_.back(kHintedList)) {
    unhint(h);
  }
  while (true) {
    uint32_t best = SlotLists::kNil;
    double best_rank = 0;
    for (uint32_t l = 0; l < kRankLists; ++l) {
      const uint32_t t = lists_.back(l);
      if (t == SlotLists::kNil) continue;
      const double r = rank(t);
      if (best == SlotLists::kNil || r < best_rank) {
        best = t;
        best_rank = r;
      }
    }
    if (best == SlotLists::kNil) return last_resort();
    if (!hinted(index_.key(best))) {
      links_.parent_slot(index_, best);  // counts it in its parent if it arrived first
      if (links_.children(best) == 0) return best;
      hold(best);  // its children go first
      continue;
    }
    // A waiting request reads it: out of the ranking until that request touches it.
    unlink(best);
    list_[best] = static_cast<uint8_t>(kHintedList);
    lists_.push_front(kHintedList, best);
    if (last_placed_ == best) last_placed_ = KeyIndex::kNone;
  }
}

uint64_t LookaheadEvictor::reader_start(uint32_t slot) const {
  const BlockKey& key = index_.key(slot);
  if (in_use_ && in_use_(key)) return 0;  // its sequence's next step reads it
  const std::optional<HintBoard::Use> use = hints_ != nullptr ? hints_->find(key) : std::nullopt;
  return use ? use->earliest_start : kNoReader;
}

uint32_t LookaheadEvictor::last_resort() const {
  uint32_t pick = SlotLists::kNil;
  uint64_t latest = 0;
  uint32_t seen = 0;
  for (uint32_t s = lists_.back(kHintedList); s != SlotLists::kNil && seen < kHintedScan;
       s = lists_.newer(s), ++seen) {
    const uint64_t start = reader_start(s);
    if (pick == SlotLists::kNil || start > latest) {
      pick = s;
      latest = start;
    }
  }
  return pick;
}

std::size_t LookaheadEvictor::take_hinted(std::size_t count, KeyFilter skip,
                                          std::vector<BlockKey>& out) const {
  struct Candidate {
    uint32_t slot;
    uint64_t start;  // its earliest waiting reader's expected start
  };
  // The kHintedScan longest-hinted blocks not refused and not taken yet, in list order (oldest
  // first), refilled from one walk of the list: each block is looked at once per call.
  std::vector<Candidate> window;
  window.reserve(kHintedScan);
  uint32_t next = lists_.back(kHintedList);
  std::size_t added = 0;
  while (added < count) {
    while (window.size() < kHintedScan && next != SlotLists::kNil) {
      const uint32_t s = next;
      next = lists_.newer(s);
      if (skip(index_.key(s))) continue;
      window.push_back(Candidate{s, reader_start(s)});
    }
    if (window.empty()) break;
    std::size_t best = 0;  // the oldest on ties
    for (std::size_t i = 1; i < window.size(); ++i) {
      if (window[i].start > window[best].start) best = i;
    }
    out.push_back(index_.key(window[best].slot));
    ++added;
    window.erase(window.begin() + static_cast<std::ptrdiff_t>(best));
  }
  return added;
}

bool LookaheadEvictor::admit(const BlockFacts& block) {
  if (hinted(block.key)) return true;
  const uint32_t victim = best_tail();
  if (victim == SlotLists::kNil) return true;
  if (list_[victim] == kHintedList) return false;  // every block here is wanted by the queue
  if (const std::optional<CarriedRank> carried = arrival_rank(block)) {
    return rank_at(carried->time, carried->cls) > rank(victim);
  }
  const auto remembered = recall_untracked(block.key);
  const uint32_t uses =
      std::max<uint32_t>({remembered ? remembered->count : 0u, block.hits + 1u, 1u});
  const uint32_t ps = block.parent.is_null() ? KeyIndex::kNone : index_.find(block.parent);
  const uint32_t list = list_for(class_after(uses, remembered, false), ps);
  return rank_at(placement_time(block.key), list) > rank(victim);
}

std::size_t LookaheadEvictor::select_victims(std::size_t count, KeyFilter skip,
                                             std::vector<BlockKey>& out) {
  if (count == 0) return 0;
  best_tail();  // moves hinted tails out of the ranking first
  // Merge the lists by rank, walking each from its tail with its own cursor.
  std::array<uint32_t, kRankLists> cursor;
  for (uint32_t l = 0; l < kRankLists; ++l) cursor[l] = lists_.back(l);
  std::size_t added = 0;
  std::size_t hinted_seen = 0;
  std::vector<BlockKey> hinted_victims;
  // A parent goes after its children here, whatever the ranks say (ChainWalk); one still waiting
  // when the walk ends is held out of the ranking (kHeldList).
  ChainWalk walk(links_, index_);
  const auto room = [&] { return added < count; };
  const auto emit = [&](uint32_t slot) {
    out.push_back(index_.key(slot));
    ++added;
  };
  while (added < count) {
    uint32_t best_l = kRankLists;
    double best_rank = 0;
    for (uint32_t l = 0; l < kRankLists; ++l) {
      if (cursor[l] == SlotLists::kNil) continue;
      const double r = rank(cursor[l]);
      if (best_l == kRankLists || r < best_rank) {
        best_l = l;
        best_rank = r;
      }
    }
    if (best_l == kRankLists) break;
    const uint32_t s = cursor[best_l];
    cursor[best_l] = lists_.newer(s);
    const BlockKey& key = index_.key(s);
    if (skip(key)) {
      walk.left(s, room, emit);
      continue;
    }
    if (hinted(key)) {
      // Kept while anything else can go; a last resort otherwise.
      if (hinted_seen++ < count) hinted_victims.push_back(key);
      continue;
    }
    if (walk.wait_for_children(s)) continue;
    emit(s);
    walk.left(s, room, emit);
  }
  for (uint32_t p : walk.still_waiting()) hold(p);
  for (uint32_t h = lists_.back(kHeldList); added < count && h != SlotLists::kNil;
       h = lists_.newer(h)) {
    if (skip(index_.key(h))) continue;
    out.push_back(index_.key(h));
    ++added;
  }
  for (std::size_t i = 0; added < count && i < hinted_victims.size(); ++i, ++added) {
    out.push_back(hinted_victims[i]);
  }
  if (added < count) added += take_hinted(count - added, skip, out);
  return added;
}

void LookaheadEvictor::describe(const BlockKey& key, BlockFacts& facts) const {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return;
  facts.hits = std::max(facts.hits, uses_[slot] > 0 ? uses_[slot] - 1 : 0);
  if (facts.depth == 0) facts.depth = depth_[slot];
  facts.rank = CarriedRank{rank_time_[slot], static_cast<uint8_t>(rank_class(slot))};
}

uint32_t LookaheadEvictor::uses_of(const BlockKey& key) const {
  const auto remembered = recall(key);
  return remembered ? remembered->count : 0;
}

std::size_t LookaheadEvictor::memory_bytes() const {
  std::size_t arrivals = 0;
  for (const std::set<ArrivalKey>& order : arrival_order_) arrivals += order.size();
  return index_.memory_bytes() + lists_.memory_bytes() + links_.memory_bytes() +
         arrivals * kArrivalNodeBytes +
         (rank_time_.capacity() + ref_time_.capacity()) * sizeof(uint64_t) +
         (uses_.capacity() + depth_.capacity()) * sizeof(uint32_t) + class_.capacity() +
         list_.capacity() + held_class_.capacity() + ghost_.memory_bytes() + model_.memory_bytes();
}

}  // namespace kvtier
