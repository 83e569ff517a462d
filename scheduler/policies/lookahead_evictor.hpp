// LookaheadEvictor (policies.eviction: lookahead): an online approximation of Belady's policy
// that uses what the engine knows about the future (the waiting queue, through a HintBoard) and
// what the tier has learned about reuse (a use count that survives eviction).
//
// Belady keeps the block whose next use is nearest. Two things predict it without an oracle:
//   - the queue: a block that a waiting request will read is needed within that queue's horizon;
//     such a block is never chosen while an unhinted one remains (it is refreshed instead), and a
//     hinted newcomer is always admitted;
//   - reuse history: in KV workloads most blocks are used once, while a prefix that came back
//     (a conversation's next turn, a shared document or system prompt) is likely to come back
//     again, and sooner the more often it did. Each block carries a use count, remembered by a
//     ghost history while the block is not cached here, so a returning prefix is recognised even
//     when its blocks were evicted in between (on_miss counts those references).
// Rank: priority = last_touch + kappa * capacity * floor(log2(uses)), lowest evicted first — LRU
// within a class of equal log-uses, where every doubling of the use count is worth a quarter of
// the tier's turnover in recency. Time is the evictor's event count (touches and misses). Each
// class is one recency list, so the victim is the lowest-priority tail over at most kClasses
// lists, O(1) per decision; no heap.
// Bypass: a newcomer whose priority would not beat the current victim's is refused (admit()),
// as Belady refuses a block whose next use is further away than every cached one's.
// Chains: accesses arrive parent first; a child touched right after its parent in the same class
// takes the parent's time and sits just behind it, so a chain leaves from its tail and its cached
// part stays a usable prefix. A child never ranks above its parent (its class is capped at the
// parent's), since it is useless without it.
// Rejected: per-class hit-density estimates (LHD-style) — on the public trace they did worse than
// this two-signal rank, because the density tables are learned from the policy's own evictions and
// starve the classes it evicts early; and exact Belady over the hinted window alone (the queue
// covers a few seconds, most reuse is minutes apart).
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/policies/chain_links.hpp"
#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/ghost_history.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class LookaheadEvictor final : public Evictor {
 public:
  static constexpr uint32_t kClasses = 8;
  static constexpr double kKappa = 0.25;
  // The ghost remembers this many times the tier's capacity (at least kMinGhost keys).
  static constexpr uint64_t kGhostFactor = 8;
  static constexpr uint64_t kMinGhost = 1u << 16;

  explicit LookaheadEvictor(const EvictorOptions& options);

  std::string_view name() const override { return "lookahead"; }
  void on_insert(const BlockFacts& block) override;
  void on_access(const BlockKey& key) override;
  void on_erase(const BlockKey& key) override;
  void on_miss(const BlockFacts& block) override;
  bool admit(const BlockFacts& block) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  void describe(const BlockKey& key, BlockFacts& facts) const override;
  bool contains(const BlockKey& key) const override { return index_.find(key) != KeyIndex::kNone; }
  std::size_t size() const override { return index_.size(); }
  std::size_t memory_bytes() const override;

  // The use count the policy holds for a key (tracked or remembered), 0 when unknown.
  uint32_t uses_of(const BlockKey& key) const;

 private:
  static uint32_t class_of(uint32_t uses);
  double priority(uint32_t slot) const {
    return static_cast<double>(time_[slot]) + weight_ * class_[slot];
  }
  bool hinted(const BlockKey& key) const;
  // Moves hinted blocks off the list tails (refreshing them); returns the slot of the best victim
  // candidate or kNil. Bounded work: each refresh moves a block to a list's front.
  uint32_t best_tail();
  void place(uint32_t slot, uint32_t uses);

  const HintBoard* hints_;
  double weight_;
  uint64_t now_ = 0;
  KeyIndex index_;
  SlotLists lists_{kClasses};
  ChainLinks links_;
  std::vector<uint64_t> time_;
  std::vector<uint32_t> uses_;
  std::vector<uint8_t> class_;
  GhostHistory ghost_;
  uint32_t last_touched_ = KeyIndex::kNone;
};

}  // namespace kvtier
