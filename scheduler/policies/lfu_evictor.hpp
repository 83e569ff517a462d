// LfuEvictor (policies.eviction: lfu): least frequently used first, least recent among equals.
//
// A saturating use counter per block (1..kMaxCount) and one recency list per count, so an access
// is O(1) (move to the front of the next list) and the victim walk visits lists from the lowest
// count, oldest first. A block entering the tier starts at 1 + the hits it already has (a block
// demoted from HBM keeps its popularity). Counters never decay: blocks that were popular long
// ago stay — the classic weakness of LFU, which is why it is an option, not the default.
// Rejected: a heap keyed by (count, time) (O(log n) per access, no gain at a bounded count).
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class LfuEvictor final : public Evictor {
 public:
  static constexpr uint32_t kMaxCount = 15;

  explicit LfuEvictor(const EvictorOptions& options);

  std::string_view name() const override { return "lfu"; }
  void on_insert(const BlockFacts& block) override;
  void on_access(const BlockKey& key) override;
  void on_erase(const BlockKey& key) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  bool contains(const BlockKey& key) const override { return index_.find(key) != KeyIndex::kNone; }
  std::size_t size() const override { return index_.size(); }
  std::size_t memory_bytes() const override;
  // The use count of a tracked block (0 when untracked).
  uint32_t count_of(const BlockKey& key) const;

 private:
  KeyIndex index_;
  SlotLists lists_{kMaxCount + 1};  // list c holds blocks with count c (list 0 unused)
  std::vector<uint8_t> count_;
};

}  // namespace kvtier
