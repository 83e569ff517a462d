#include "scheduler/policies/shadowed_first.hpp"

#include <unordered_set>
#include <utility>

namespace kvtier {

ShadowedFirstEvictor::ShadowedFirstEvictor(std::unique_ptr<Evictor> inner)
    : inner_(std::move(inner)) {}

void ShadowedFirstEvictor::on_erase(const BlockKey& key) {
  if (const uint32_t slot = index_.find(key); slot != KeyIndex::kNone) {
    order_.remove(0, slot);
    index_.erase(slot);
  }
  inner_->on_erase(key);
}

void ShadowedFirstEvictor::on_shadowed(const BlockKey& key, bool shadowed) {
  if (!inner_->contains(key)) return count_misuse();
  const uint32_t slot = index_.find(key);
  if (shadowed && slot == KeyIndex::kNone) {
    const uint32_t added = index_.insert(key);
    if (added == KeyIndex::kNone) return count_misuse();
    order_.reserve_slots(index_.slot_limit());
    order_.push_front(0, added);
  } else if (!shadowed && slot != KeyIndex::kNone) {
    order_.remove(0, slot);
    index_.erase(slot);
  }
}

bool ShadowedFirstEvictor::admit(const BlockFacts& block) {
  return index_.size() > 0 || inner_->admit(block);
}

std::size_t ShadowedFirstEvictor::select_victims(std::size_t count, KeyFilter skip,
                                                 std::vector<BlockKey>& out) {
  std::size_t added = 0;
  for (uint32_t s = order_.back(0); s != SlotLists::kNil && added < count; s = order_.newer(s)) {
    const BlockKey& key = index_.key(s);
    if (skip(key)) continue;
    out.push_back(key);
    ++added;
  }
  if (added == count) return added;
  if (added == 0) return inner_->select_victims(count, skip, out);
  // The inner policy ranks the shadowed blocks too: the ones already offered are not offered twice.
  std::unordered_set<BlockKey, BlockKeyHash> offered(out.end() - static_cast<std::ptrdiff_t>(added),
                                                     out.end());
  const auto refuse = [&](const BlockKey& k) { return skip(k) || offered.count(k) != 0; };
  return added + inner_->select_victims(count - added, KeyFilter(refuse), out);
}

std::size_t ShadowedFirstEvictor::memory_bytes() const {
  return inner_->memory_bytes() + index_.memory_bytes() + order_.memory_bytes();
}

std::unique_ptr<Evictor> shadowed_first(std::unique_ptr<Evictor> inner, Tier tier,
                                        const WriteStrategy& write) {
  if (tier == Tier::kHbm || write.keeps_shadowed_copies() || inner == nullptr) return inner;
  return std::make_unique<ShadowedFirstEvictor>(std::move(inner));
}

}  // namespace kvtier
