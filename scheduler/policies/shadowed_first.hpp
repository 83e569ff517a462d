// ShadowedFirstEvictor: the eviction order of a tier below HBM, where a copy that a faster tier
// also holds in full goes before any block only this tier holds.
//
// A promotion copies a block up and leaves its lower copies in place, so that evicting it from the
// faster tier later is a plain drop. While the faster copy lives, the lower one adds no hit: it is
// capacity the cache loses. Under write_back, where nothing else asks for copies below, such a
// "shadowed" copy is the first victim of its tier; until the tier needs the room it stays, free.
// Dropping it costs a write only if the block is evicted from the faster tier later and is still
// worth keeping (it is demoted again, like any block). Measured on the public Mooncake trace,
// 512-token blocks, HBM 16 / host 64 / NVMe 256 GiB: LRU 29.33 -> 29.46 %, lookahead 30.24 ->
// 30.65 %, each what one cache of the summed size gets (29.46 %, 30.65 %).
//
// A decorator over any policy (lru, lookahead, ...): the inner policy hears every call and ranks
// every block, shadowed or not; this class only keeps the shadowed ones in a list (the oldest
// shadowed first) and offers them ahead of the inner policy's victims. The caller reports what is
// shadowed through on_shadowed (Evictor); Placement re-checks it in the page table before it drops
// a copy (never trusting this list), so a stale mark costs order, never a block. ~40 bytes per
// shadowed block, of which there are at most as many as the faster tiers hold.
#pragma once

#include <memory>

#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/key_index.hpp"
#include "scheduler/policies/write_strategy.hpp"

namespace kvtier {

class ShadowedFirstEvictor final : public Evictor {
 public:
  explicit ShadowedFirstEvictor(std::unique_ptr<Evictor> inner);

  std::string_view name() const override { return inner_->name(); }
  void on_insert(const BlockFacts& block) override { inner_->on_insert(block); }
  void on_access(const BlockKey& key) override { inner_->on_access(key); }
  void on_erase(const BlockKey& key) override;
  void on_miss(const BlockFacts& block) override { inner_->on_miss(block); }
  void on_shadowed(const BlockKey& key, bool shadowed) override;
  void on_released(const BlockKey& key) override { inner_->on_released(key); }
  void on_request_end(std::span<const BlockKey> keys, uint64_t output_tokens) override {
    inner_->on_request_end(keys, output_tokens);
  }
  // A newcomer takes the place of a shadowed copy at no loss; else the inner policy decides.
  bool admit(const BlockFacts& block) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  void describe(const BlockKey& key, BlockFacts& facts) const override {
    inner_->describe(key, facts);
  }
  bool contains(const BlockKey& key) const override { return inner_->contains(key); }
  std::size_t size() const override { return inner_->size(); }
  std::size_t memory_bytes() const override;
  uint64_t misuse() const override { return Evictor::misuse() + inner_->misuse(); }

  // Tracked blocks marked shadowed now.
  std::size_t shadowed() const { return index_.size(); }

 private:
  std::unique_ptr<Evictor> inner_;
  KeyIndex index_;      // the shadowed keys
  SlotLists order_{1};  // shadowed keys, the most recently shadowed at the front
};

// The evictor of `tier`: `inner` wrapped so that shadowed copies go first in a tier below HBM when
// the write strategy keeps no copies below on purpose (!keeps_shadowed_copies), else `inner`
// itself. The one place that rule lives (scheduler, replay and tests build their tiers with it).
std::unique_ptr<Evictor> shadowed_first(std::unique_ptr<Evictor> inner, Tier tier,
                                        const WriteStrategy& write);

}  // namespace kvtier
