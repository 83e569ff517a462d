// LruEvictor (policies.eviction: lru): least recently used first.
//
// One list over KeyIndex slots; an access or insert moves the block to the front, victims come
// from the back. 8 bytes of links per block plus the index. Accesses are taken in the order the
// caller reports them, so within one request the deepest block ends up the most recent and the
// chain's first block leaves first — plain LRU, the baseline the other policies are measured
// against (prefix_aware is the variant that keeps chains whole).
#pragma once

#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class LruEvictor final : public Evictor {
 public:
  explicit LruEvictor(const EvictorOptions& options);

  std::string_view name() const override { return "lru"; }
  void on_insert(const BlockFacts& block) override;
  void on_access(const BlockKey& key) override;
  void on_erase(const BlockKey& key) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  bool contains(const BlockKey& key) const override { return index_.find(key) != KeyIndex::kNone; }
  std::size_t size() const override { return index_.size(); }
  std::size_t memory_bytes() const override;

 private:
  KeyIndex index_;
  SlotLists lists_{1};
};

}  // namespace kvtier
