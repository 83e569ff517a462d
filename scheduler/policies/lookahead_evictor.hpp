// LookaheadEvictor (policies.eviction: lookahead): Belady's policy on predicted next uses — exact
// ones from the open sequences and the engine's waiting queue, learned ones for everything else.
//
// Belady evicts the block whose next use is furthest away. The policy predicts it in two ways:
//   - what is known: a block an open sequence holds is read by that sequence's next step (every
//     step reads all of its KV; EvictorOptions::in_use), a block a waiting request will read
//     (a HintBoard) within the queue's horizon; such a "hinted" block is never chosen while an
//     unhinted one remains (reaching a list's tail, it moves to a hinted list outside the ranking
//     until a request touches it or it is no longer hinted); when only hinted blocks can go, the
//     one whose reader starts last goes first (an open sequence's: now, so last of all); a hinted
//     newcomer is always admitted, and an unhinted one is refused when only hinted blocks could
//     make room. Without the open sequences, ranked by class, a decoding sequence's blocks (one
//     use so far) were the first victims between its steps and were loaded back for the next:
//     the Mooncake trace at its recorded rate in kvtier-bench run (virtual clock, H200) served
//     0.84 requests/s, with stall 67 % of step time; with them 2.15 and 25 %, and 2.38 and 11 %
//     once a block whose sequence closed leaves the hinted list at once (on_released) instead of
//     waiting behind a longer-lived sequence's blocks at the list's back (LRU then 1.78 and 38 %;
//     2.26 and 11 % once Placement offered every policy's open-sequence blocks last);
//   - the block's class: its reuse count so far (1, 2-3, 4-7, 8-15, 16+ references, remembered
//     across evictions by a GhostTable) and whether it ended the request that last referenced it;
//     a first use, once its request ended (on_request_end), also by the tokens that request
//     generated (fewer than 16, 64, 256, or more; see "Request shape" below).
//     A ReuseModel learns each class's expected gap to the next reference, G(c), truncated at a
//     horizon of kHorizonCapacities turnovers (of the whole cache, every tier's frames,
//     EvictorOptions::cache_blocks, in the last tier; of the tier itself in a tier above, see
//     Hierarchy), from every hit and miss the tier sees, as survival analysis
//     does (an interval still open counts for the ages it reached); a class with little
//     evidence ranks like the class of half its uses.
// Clock: the count of references (on_access, on_miss) this evictor has seen.
// Prediction: a block last referenced `age` references ago is expected back in age + G(c) —
// gaps of KV reuse are heavy-tailed (a prefix not reused for a while is less and less likely to
// come back soon), so the residual grows with the age instead of shrinking. Evicting the largest
// age + G(c) is evicting the smallest rank = last reference - G(c): LRU within a class, each
// class shifted by its learned gap. One recency list per class; the victim is the lowest-rank
// tail over kClasses lists, O(1) per decision; no heap.
// Bypass: a newcomer whose rank would not beat the current victim's is refused (admit()), as
// Belady refuses a block whose next use is further away than every cached one's.
// Chains: accesses arrive parent first; a child touched right after its parent in the same list
// takes the parent's time and sits just behind it, so a chain leaves from its tail and its cached
// part stays a usable prefix. A child never ranks above its parent: when its own class has the
// smaller gap it joins its parent's list, since it is useless without it. Ranks can still put a
// parent first (its class's gap learned smaller since, or both demoted with the ranks of two
// different runs), so the victim walk makes it a rule: a block whose children this tier holds
// waits until they have left the walk, and goes right after the last of them (every hit on a
// child is a hit on its parent, so keeping the child instead is never better); one whose
// children stay is held out of the ranking until the last of them leaves (O(1) per hold, where
// walking past it at every decision made replays of long chains quadratic). ChainLinks counts
// a child that arrived first (demotion sends chains down tail first) when its parent arrives.
// Request shape: whether a block computed for a prompt is ever used again depends on what the
// request was, and the engine knows one thing about that when the request ends: how much it
// generated. A question over a long document answered in a few tokens leaves a context the next
// question reuses; a long generation from a one-off prompt leaves one nobody asks for again. On
// the Mooncake trace, prompts first answered in under 64 tokens are used 2.8-4.4 times in all on
// average, those answered in 64 or more 1.0-2.0 times. The policy learns what each output bucket
// says (it assumes nothing about which comes back): a block's first interval opens in the class
// of every first use, which pools the buckets' evidence (ReuseModel pools) and answers while the
// request is open (admission, in the replay), and moves to its bucket's class when the request
// ends (on_request_end); a reused block's class stays its use count, whatever its last request
// generated (among prompts used twice or more, 69-90 % come back in every bucket). One tier of
// the trace, 512-token blocks, with the queue: 35.6 -> 36.7 % at 3e6 tokens, 60.3 -> 63.7 % at
// 1e7 (OPT 65.1), 19.2 -> 19.4 at 1e6; the generated chat and agent workloads, whose output
// lengths are drawn apart from their reuse, move by at most 0.13 points on one tier. Were the
// bucket known when the block is computed (it is not: the engine learns it at the end), 38.1 %
// at 3e6: newcomers rank as an average first use and displace a returning prefix. Tried with it:
// the prompt's length as well (no further gain), and log2 output buckets (the same).
// Hierarchy: every tier's evictor hears every reference, so the tiers' clocks agree. What the
// last tier evicts leaves the cache, so it measures its horizon in the whole cache: a block leaves
// about when it would leave one cache of the summed size. What a tier above evicts moves down and
// stays cached; its choice decides how far away a block is when next read (a load, on the step's
// critical path), not whether it hits, so it measures its horizon in its own frames and ranks
// nearly by recency. Measured with the scheduler (`kvtier-bench run`, virtual clock, H200): every
// tier on the cache's horizon, the upper tiers kept a returning prefix over what was just computed
// and loaded it back on the next turn; on the Mooncake trace at a third of its rate TTFT mean
// 5.5 s, stall 15 % of step time, against 1.1 s and 1.1 % on their own horizons (LRU 1.2 s, 1.0 %),
// at the same hit rate (58.6 / 58.5 %). The replay, which counts a hit in any tier alike, prefers
// the cache's horizon everywhere by 0.44 points over 42 runs of three tiers (and no run below
// LRU either way). The ghost is the cache's in every case (see One history): with a ghost of its
// own size only, the upper tiers forgot use counts (16/64/256 GiB at 16-token blocks: 22.7 %,
// against 31.6 with the cache's ghost and 30.2 with both per tier). A
// block demoted into this tier brings the rank the tier above gave it (BlockFacts::rank: its rank
// time and class) and keeps it, in a second list per class; ranking it from its arrival instead, as
// fresh as a block used just now, would count the upper tier's preference twice (a block that
// tier kept long for its class arrives old). An arrived list is ordered by rank time, then by
// depth (one run shares a time; the deeper block goes first), through an ordered index, so a
// chain leaves from its tail in whatever order the tier above sends it down. A run (references
// each the child of the one before) ranks from its first reference in every tier, also where a
// tier holds only part of it. Only the last tier refuses blocks (Placement).
// Measured on the public trace, 512-token blocks, online: default tiny tiers 2.64 -> 2.88 %
// (LRU 2.86), 8/4/9 GiB 2.02 -> 2.99 (LRU 2.78); 16-token blocks, default tiers 2.68 -> 2.83
// with that order, 2.95 with the parents-after-children rule (LRU 2.86), 16/64/256 GiB 29.06 ->
// 29.27 (LRU 29.33): at that grain a chain is 32 blocks per trace block, and the ranks alone let
// tiers drop heads before tails. With the copies a promotion leaves below going first
// (ShadowedFirstEvictor, write_back): 3.08 and 29.94 (LRU 2.91 and 29.46); 512-token 16/64/256
// GiB 30.65, what one tier of the summed size gets.
// Ended-request flag: a reference ends its request unless the next reference this tier sees is
// to its child; it is settled on that next reference (the block ranks as "continued" meanwhile).
// Final partial blocks, rewritten by the next turn, land in the ended classes and the model learns
// they do not come back; in a workload whose last full block is the next turn's prefix, it learns
// the opposite. A lower tier sees only part of each request, so there the flag means "the last
// block of a run this tier saw"; the model learns whatever that predicts.
// One history: what a tier knows of a block it does not hold (last reference, use count, class)
// is the same in every tier, since each hears every reference. So the tiers built together
// (make_tier_evictors) keep one ghost, the last tier's, and the tiers above read a block's
// history from it: from its ghost, or from its own bookkeeping where it holds the block. They
// hear each reference just before the last tier does, so what they read is the history up to
// the reference before, as their own ghost would have held it; the one thing they know first is
// a request's end they settled just now, kept until the last tier settles it too (a block
// referenced again at once, as the next request's first block). They record nothing. The tiers
// decide exactly as with a ghost each as long as those ghosts forget nothing (a test checks it);
// where they do, they forget different entries, and the Mooncake matrix moves by -0.04 points in
// all over 42 runs (at most 0.1 in one). At 16/64/256 GiB, 16-token blocks: 736 MB resident for
// the replay instead of 1.78 GB.
// Memory per tracked block: ~97 bytes (index, lists, chain links, two times, count, class, list,
// depth), plus ~56 per block in an arrived list's index, plus ChainLinks' waiting lists, plus 16
// bytes per ghost entry at kGhostFactor entries per frame of the cache (between kMinGhost and
// kMaxGhost entries) in the last tier only.
//
// What it cannot do (measured on the public Mooncake trace, 512-token blocks, --lookahead 32):
// most blocks are referenced once, and among prefixes that did come back, nothing observable
// (reuse count, gaps so far, time since last use, lifetime rate) predicts WHEN they come back: the
// ranking quality (AUC) of each such signal for "back within 65 requests" is 0.54-0.60. Offline
// oracles that use the window exactly and rank the rest by the trace's own per-class reuse tables
// (use count, age, end of request, request length, previous gap) reach 22.9 % / 38.2 % at 1e6 /
// 3e6 tokens, against 38.3 % / 56.0 % for OPT; `kvtier-bench replay`'s count_oracle, which knows
// every block's references left exactly (not when), 25.4 % / 47.3 %.
// Rejected: the previous rank, a fixed bonus of a quarter of the tier's turnover per doubling of
// the use count (1.3 points lower at 3e6 tokens on that trace, 1.0-1.9 lower on a chat workload);
// a fixed penalty for blocks never reused (two turnovers: 1.3 points higher at 3e6 on that trace,
// but down to LRU's level at 3e6 on the chat workload — a constant that suits one workload);
// three quarters of the class gap (rank time - 0.75 G(c), as a gap distribution whose residual
// grows with age would have it): on one tier of the trace, 16-token blocks, it gains 0.23-0.35
// points at 3.5e5, 4e5 and 3e6 tokens and loses 0.07 at 1e6 (still 0.13 below LRU at 3.5e5);
// with 512-token blocks, over 42 runs of three tiers, three workloads and both queue lengths it
// loses 0.76 points in all, chat in most;
// a horizon of 4 turnovers instead of 8: 9 points lost over the same 42, chat in every one; 16
// turnovers, with the survival estimate: +1.07 points over the same 42, but one tier of the trace
// loses at 1e7 tokens (60.1 -> 59.4 %) and with the queue at 1e6 (19.2 -> 19.0);
// per-class hit-density or hazard tables by age (LHD-style): even fitted offline to the trace they
// ranked no better than the truncated mean over the same classes; splitting the classes of
// reused blocks by their previous gap (two buckets cut at H/4 to H/32 of the horizon H, or three
// at H/16 and H/2, H/32 and H/4, H/64 and H/4): on one tier, 512-token blocks, the trace and both
// generated workloads at 26 capacities and queue lengths, every split lost, 0.4 to 4.1 points
// summed (each split class learns from a fraction of the evidence); and exact Belady over the
// hinted window alone (the queue covers a few seconds, most reuse is minutes apart).
// Also rejected: choosing per tier, online, how much the class gaps count (rank time - a x G(c),
// a in {1, 0}), since recency alone suited the bottom of the configuration's three tiny tiers on
// the public trace before the hierarchy's order was mended (2.93 % against 2.68 %; LRU 2.86 %) and
// costs 2.2 points on the chat workload. By regret (LeCaR: each disagreeing eviction drawn by
// weight, a ranking's weight cut when a block it evicted comes back), learning rates 0.01-0.45,
// discounts 0.005-0.5: 2.7-2.8 % on the trace but chat 21.1 -> 18.9-19.1 % in every setting, even
// learning in the bottom tier only: regret counts quick returns, and the blocks the gaps evict
// (young, of classes rarely reused) come back soon more often than the old ones they keep, whose
// value shows only later. By miniature simulations (two copies of the tier on a key sample,
// 256-1024 blocks each, one per a; the tier follows the one with more hits, decayed, with a 2 % or
// 2-sigma margin): 2.75-2.88 % on the trace only with the copies in the bottom tier alone, and
// there a wrong switch cost 1.1 points of the 3e6-token single tier (32.1 -> 31.0 %); in upper
// tiers a copy counts its own hits, while a's effect is on what the tiers below then hold (a = 0 in
// HBM: chat +0.3, agent +0.6 overall, though the copies rated it far worse).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "scheduler/policies/chain_links.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/ghost_table.hpp"
#include "scheduler/policies/key_index.hpp"
#include "scheduler/policies/reuse_model.hpp"

namespace kvtier {

class LookaheadEvictor final : public Evictor {
 public:
  // Use-count buckets: 1, 2-3, 4-7, 8-15, 16+ references.
  static constexpr uint32_t kUseBuckets = 5;
  // A first use whose request ended is classed by the tokens the request generated, in buckets
  // below each of kOutputBounds, and one above them all.
  static constexpr std::array<uint64_t, 3> kOutputBounds = {16, 64, 256};
  static constexpr uint32_t kOutputBuckets = kOutputBounds.size() + 1;
  // Kinds of reference, each split by the ended-request flag into two classes (2 x kind + flag):
  // kind 0 a first use whose request has not ended (pools kinds 1..kOutputBuckets), kinds
  // 1..kOutputBuckets a first use by its request's output bucket, then the use buckets from 2-3
  // references on.
  static constexpr uint32_t kKinds = kOutputBuckets + kUseBuckets;
  static constexpr uint32_t kClasses = 2 * kKinds;
  // Ranked lists, two per class: [0, kClasses) for blocks referenced, computed or promoted here
  // (placed at this tier's clock, so pushed to the front), [kArrivedLists, kRankLists) for blocks
  // demoted into it with the rank of the tier above (older times; inserted in order).
  static constexpr uint32_t kArrivedLists = kClasses;
  static constexpr uint32_t kRankLists = 2 * kClasses;
  // The list of blocks a waiting request reads, outside the ranking (after the ranked lists).
  static constexpr uint32_t kHintedList = kRankLists;
  // The list of parents held back while children of theirs are tracked here, outside the ranking
  // (last): each is ranked again, by its rank time, when its last child leaves.
  static constexpr uint32_t kHeldList = kRankLists + 1;
  // When only hinted blocks can go, the one whose reader starts last among this many of the
  // longest-hinted goes first (Belady within the queue, at bounded cost).
  static constexpr uint32_t kHintedScan = 16;
  // The model's horizon, in turnovers of the cache's capacity (the tier's own above the last): a
  // block back later than this is worth no more to the tier than one that never comes back.
  static constexpr uint64_t kHorizonCapacities = 8;
  // The model's counts halve every this many horizons.
  static constexpr uint64_t kHalfLifeHorizons = 16;
  // The ghost remembers this many times the cache's capacity, at least kMinGhost and at most
  // kMaxGhost keys (16 bytes each: 2 KiB per frame of the cache, 0.1 % of a 16-token block of
  // 128 KiB per token; 1 GiB at most; in the last tier, read by the others). Past the model's
  // horizon: the use counts that set a block's class build up over gaps of many turnovers. One tier
  // of the public trace, 16-token blocks, online, ten capacities from 3e5 to 5e5 tokens, with the
  // ghost's age-per-reference rule: lookahead fell below LRU at two of them with 32 per frame (7.79
  // against 7.87 % at 4.6e5), at one with 64 (7.15 against 7.18 at 4e5), at none with 128 (6.44
  // and 7.44 against 6.29 and 7.18 at 3.5e5 and 4e5). 16 per frame with plain recency, before: 5.92
  // and 6.85.
  static constexpr uint64_t kGhostFactor = 128;
  static constexpr uint64_t kMinGhost = 1u << 16;
  static constexpr uint64_t kMaxGhost = 1u << 26;

  // `history`, when given, is the last tier of the same cache: this tier keeps no ghost and reads
  // the history of blocks it does not hold from it (see "One history" above). It must outlive
  // this evictor and hear every reference right after this one does.
  explicit LookaheadEvictor(const EvictorOptions& options,
                            const LookaheadEvictor* history = nullptr);

  std::string_view name() const override { return "lookahead"; }
  void on_insert(const BlockFacts& block) override;
  void on_access(const BlockKey& key) override;
  void on_erase(const BlockKey& key) override;
  void on_miss(const BlockFacts& block) override;
  void on_released(const BlockKey& key) override;
  // Moves the request's first uses (tracked or remembered) to the class of its output bucket.
  void on_request_end(std::span<const BlockKey> keys, uint64_t output_tokens) override;
  bool admit(const BlockFacts& block) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  void describe(const BlockKey& key, BlockFacts& facts) const override;
  bool contains(const BlockKey& key) const override { return index_.find(key) != KeyIndex::kNone; }
  std::size_t size() const override { return index_.size(); }
  std::size_t memory_bytes() const override;

  // The use count the policy holds for a key (tracked or remembered), 0 when unknown.
  uint32_t uses_of(const BlockKey& key) const;
  // What this tier knows of a block's last reference: its time (this tier's clock), its use count
  // and its class, from its own bookkeeping when it tracks the block, else from its ghost (or the
  // tier it reads its history from); nullopt when it knows nothing.
  std::optional<GhostTable::Entry> recall(const BlockKey& key) const;
  // The class a block of `uses` references falls in (ended: it ended its request); a first use is
  // in kind 0 until its request ends.
  static uint32_t class_of(uint32_t uses, bool ended);
  // The class of a first use whose request ended after generating `output_tokens`.
  static uint32_t first_use_class(uint64_t output_tokens, bool ended);
  // The class of a block of `uses` references whose last reference is `remembered` (nullopt:
  // none): a first use keeps the output bucket its request's end gave it (a block demoted or
  // promoted into a tier, a newcomer asked about).
  static uint32_t class_after(uint32_t uses, const std::optional<GhostTable::Entry>& remembered,
                              bool ended);
  const ReuseModel& model() const { return model_; }

 private:
  // The class whose gap shifts the slot's rank: its list's, its own in the hinted list, the one
  // it ranked in before it was held in the held list.
  uint32_t rank_class(uint32_t slot) const {
    if (list_[slot] == kHintedList) return class_[slot];
    if (list_[slot] == kHeldList) return held_class_[slot];
    return list_[slot] % kClasses;
  }
  // The rank of a block ranking from `time` in class `cls`; lowest first (the next victim).
  double rank_at(uint64_t time, uint32_t cls) const {
    return static_cast<double>(time) - model_.expected_gap(cls);
  }
  double rank(uint32_t slot) const { return rank_at(rank_time_[slot], rank_class(slot)); }
  // Wanted soon for sure: a waiting request reads it, or an open sequence holds it.
  bool hinted(const BlockKey& key) const;
  // The class list a block of class `cls` joins: its parent's class when that one has the
  // larger gap.
  uint32_t list_for(uint32_t cls, uint32_t parent_slot) const;
  // The rank a demoted block brings from the tier above (kept); nullopt for any other arrival.
  static std::optional<CarriedRank> arrival_rank(const BlockFacts& block);
  // Takes a block no longer hinted out of the hinted list and ranks it as if touched now.
  void unhint(uint32_t slot);
  // Moves hinted blocks off the class lists' tails into the hinted list (and blocks no longer
  // hinted back); returns the best victim candidate: the lowest-rank unhinted tail, else the
  // hinted list's oldest, else kNil. Amortised O(1): a block enters the hinted list once per
  // waiting request that reads it.
  uint32_t best_tail();
  // When the slot's block is next read for sure: 0 (now) for a block an open sequence holds,
  // else the expected start of the earliest waiting request that reads it, kNoReader when no one
  // is known to (a hinted-list block whose reader went away: the first to go).
  static constexpr uint64_t kNoReader = UINT64_MAX;
  uint64_t reader_start(uint32_t slot) const;
  // Among the kHintedScan longest-hinted blocks, the one whose earliest waiting reader starts
  // last (the oldest on ties); kNil when the hinted list is empty. take_hinted's first pick
  // without a filter.
  uint32_t last_resort() const;
  // Up to `count` victims from the hinted list, appended to `out`: each time, among the
  // kHintedScan longest-hinted blocks not refused by `skip` nor taken yet, the one whose earliest
  // waiting reader starts last (the oldest on ties). One walk of the list per call, O(count x
  // kHintedScan) comparisons.
  std::size_t take_hinted(std::size_t count, KeyFilter skip, std::vector<BlockKey>& out) const;
  // Ranks `slot` from `time` in its class list (see list_for).
  void place(uint32_t slot, uint64_t time);
  // Ranks `slot` from `time` in `list`; a child placed right after its parent in the same list
  // takes the parent's time and goes just behind it.
  void place_in(uint32_t slot, uint32_t list, uint32_t parent_slot, uint64_t time);
  // Links `slot` into `list` where its rank time belongs: the front of a class list; in an
  // arrived list, behind every block ranking from a later time or, from the same time (one run),
  // shallower in its chain, found in arrival_order_ (O(log n)).
  void insert_ranked(uint32_t list, uint32_t slot);
  // Takes `slot` out of its list (and an arrived list's order).
  void unlink(uint32_t slot);
  // Moves a parent whose children are tracked here out of the ranking, into kHeldList.
  void hold(uint32_t slot);
  // Ranks a held parent again (its last child left): by its rank time, in the arrived list of the
  // class it ranked in.
  void release(uint32_t slot);
  // An arrived block's place in its list: later rank times first, then shallower blocks.
  struct ArrivalKey {
    uint64_t time;
    uint32_t depth;
    uint32_t slot;
    bool operator<(const ArrivalKey& o) const {
      if (time != o.time) return time > o.time;
      if (depth != o.depth) return depth < o.depth;
      return slot < o.slot;
    }
  };
  ArrivalKey arrival_key(uint32_t slot) const {
    return ArrivalKey{rank_time_[slot], depth_[slot], slot};
  }
  // What one entry of arrival_order_ costs: the key and a red-black tree node's links.
  static constexpr std::size_t kArrivalNodeBytes = sizeof(ArrivalKey) + 32;
  // A new reference arrived whose parent is `parent`: settles the ended-request flag of the
  // previous reference (ended unless this one continues it).
  void settle_pending(const BlockKey& parent);
  // Moves a tracked block's open interval to class `to` and ranks it in that class's list (a
  // block in the hinted or held list is ranked again when it leaves).
  void reclass(uint32_t slot, uint32_t to);
  // Records a reference to `key` (child of `parent`): it continues the run when its parent was
  // the reference just before, else starts one.
  void note_reference(const BlockKey& parent, const BlockKey& key);
  // The time a block placed now ranks from: its run's start when it was the last reference (a
  // block just read, computed or promoted), else now.
  uint64_t placement_time(const BlockKey& key) const {
    return key == last_reference_ ? run_start_ : now_;
  }
  void tick();
  // recall() of a block this tier does not track (its ghost, or the history it reads).
  std::optional<GhostTable::Entry> recall_untracked(const BlockKey& key) const;
  // Records a block's last reference in this tier's ghost; a tier that reads its history from the
  // last tier records nothing (the last tier records the same reference itself).
  void remember(const BlockKey& key, const GhostTable::Entry& entry);
  // Marks the remembered reference `entry` of an untracked block as having ended its request;
  // a tier reading the last tier's history keeps the mark until the last tier makes it too.
  void remember_ended(const BlockKey& key, const GhostTable::Entry& entry);
  // Gives the remembered reference of an untracked block the class `cls` (its own ghost only: a
  // tier reading the last tier's history hears the request's end before the last tier does).
  void remember_class(const BlockKey& key, uint32_t cls);

  const HintBoard* hints_;
  std::function<bool(const BlockKey&)> in_use_;  // EvictorOptions::in_use
  const LookaheadEvictor* history_;              // null: this tier's own ghost
  // With a history: the block (and the time of its reference) whose request end this tier
  // settled last; the history shows it once the last tier has heard the same reference.
  BlockKey ended_key_;
  uint64_t ended_time_ = 0;
  uint64_t now_ = 0;
  KeyIndex index_;
  SlotLists lists_{kRankLists + 2};
  ChainLinks links_;
  // List order: when placed here (now, or when it left the hinted list), or the carried rank.
  std::vector<uint64_t> rank_time_;
  std::vector<uint64_t> ref_time_;  // last reference (the model's intervals)
  std::vector<uint32_t> uses_;
  std::vector<uint8_t> class_;  // the learning class of the last reference
  // The slot's list: a class list (class_'s or its parent's), that plus kArrivedLists,
  // kHintedList or kHeldList.
  std::vector<uint8_t> list_;
  std::vector<uint8_t> held_class_;  // the class a held parent ranked in
  GhostTable ghost_;
  ReuseModel model_;
  uint32_t last_placed_ = KeyIndex::kNone;
  BlockKey pending_;  // the last referenced key, its ended flag not settled yet (null: none)
  // The current run: references each continuing the previous one's chain (parent, then child).
  BlockKey last_reference_;
  uint64_t run_start_ = 0;       // the clock at the run's first reference
  std::vector<uint32_t> depth_;  // blocks before the slot's block in its chain
  // Per arrived list, its blocks in list order (front first): where an arrival goes in O(log n).
  std::array<std::set<ArrivalKey>, kClasses> arrival_order_;
};

}  // namespace kvtier
