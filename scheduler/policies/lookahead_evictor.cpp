#include "scheduler/policies/lookahead_evictor.hpp"

#include <algorithm>
#include <bit>

#include "scheduler/policies/hint_board.hpp"

namespace kvtier {

LookaheadEvictor::LookaheadEvictor(const EvictorOptions& options)
    : hints_(options.hints),
      weight_(kKappa * static_cast<double>(options.capacity_blocks)),
      index_(options.expected_blocks),
      ghost_(std::max<uint64_t>(kMinGhost, kGhostFactor * options.capacity_blocks)) {}

uint32_t LookaheadEvictor::class_of(uint32_t uses) {
  if (uses <= 1) return 0;
  return std::min<uint32_t>(kClasses - 1, static_cast<uint32_t>(std::bit_width(uses)) - 1);
}

bool LookaheadEvictor::hinted(const BlockKey& key) const {
  return hints_ != nullptr && hints_->contains(key);
}

void LookaheadEvictor::place(uint32_t slot, uint32_t uses) {
  uses_[slot] = uses;
  uint32_t cls = class_of(uses);
  const uint32_t ps = links_.parent_slot(index_, slot);
  if (ps != KeyIndex::kNone) cls = std::min<uint32_t>(cls, class_[ps]);
  class_[slot] = static_cast<uint8_t>(cls);
  if (ps != KeyIndex::kNone && ps == last_touched_ && class_[ps] == cls) {
    time_[slot] = time_[ps];
    lists_.insert_older_than(cls, ps, slot);
  } else {
    time_[slot] = now_;
    lists_.push_front(cls, slot);
  }
  last_touched_ = slot;
}

void LookaheadEvictor::on_miss(const BlockFacts& block) {
  ++now_;
  if (index_.find(block.key) != KeyIndex::kNone) return;  // present here: not a miss
  const uint32_t c = ghost_.count(block.key);
  ghost_.put(block.key, c == UINT32_MAX ? c : c + 1);
}

void LookaheadEvictor::on_insert(const BlockFacts& block) {
  if (index_.find(block.key) != KeyIndex::kNone) return count_misuse();
  const uint32_t slot = index_.insert(block.key);
  if (slot == KeyIndex::kNone) return count_misuse();
  const uint32_t limit = index_.slot_limit();
  lists_.reserve_slots(limit);
  links_.reserve_slots(limit);
  if (time_.size() < limit) {
    time_.resize(limit, 0);
    uses_.resize(limit, 0);
    class_.resize(limit, 0);
  }
  ++now_;
  // A miss already counted this reference in the ghost; a block demoted or promoted into this
  // tier brings its hit count.
  const uint32_t remembered = ghost_.take(block.key);
  const uint32_t uses = std::max<uint32_t>({remembered, block.hits + 1u, 1u});
  links_.attach(index_, slot, block.parent);
  place(slot, uses);
}

void LookaheadEvictor::on_access(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  ++now_;
  lists_.remove(class_[slot], slot);
  place(slot, uses_[slot] == UINT32_MAX ? uses_[slot] : uses_[slot] + 1);
}

void LookaheadEvictor::on_erase(const BlockKey& key) {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return count_misuse();
  ghost_.put(key, uses_[slot]);
  links_.detach(index_, slot);
  lists_.remove(class_[slot], slot);
  if (last_touched_ == slot) last_touched_ = KeyIndex::kNone;
  index_.erase(slot);
}

uint32_t LookaheadEvictor::best_tail() {
  uint64_t refresh_budget = index_.size();
  while (true) {
    uint32_t best = SlotLists::kNil;
    double best_priority = 0;
    for (uint32_t c = 0; c < kClasses; ++c) {
      const uint32_t t = lists_.back(c);
      if (t == SlotLists::kNil) continue;
      const double p = priority(t);
      if (best == SlotLists::kNil || p < best_priority) {
        best = t;
        best_priority = p;
      }
    }
    if (best == SlotLists::kNil || refresh_budget == 0 || !hinted(index_.key(best))) return best;
    // A waiting request reads it: it is as good as touched now.
    --refresh_budget;
    lists_.remove(class_[best], best);
    time_[best] = ++now_;
    lists_.push_front(class_[best], best);
    if (last_touched_ == best) last_touched_ = KeyIndex::kNone;
  }
}

bool LookaheadEvictor::admit(const BlockFacts& block) {
  if (hinted(block.key)) return true;
  const uint32_t victim = best_tail();
  if (victim == SlotLists::kNil) return true;
  uint32_t uses = std::max<uint32_t>({ghost_.count(block.key), block.hits + 1u, 1u});
  uint32_t cls = class_of(uses);
  const uint32_t ps = block.parent.is_null() ? KeyIndex::kNone : index_.find(block.parent);
  if (ps != KeyIndex::kNone) cls = std::min<uint32_t>(cls, class_[ps]);
  const double newcomer = static_cast<double>(now_) + weight_ * cls;
  return newcomer > priority(victim);
}

std::size_t LookaheadEvictor::select_victims(std::size_t count, KeyFilter skip,
                                             std::vector<BlockKey>& out) {
  if (count == 0) return 0;
  best_tail();  // refresh hinted tails first
  // Merge the class lists by priority, walking each from its tail with its own cursor.
  std::array<uint32_t, kClasses> cursor;
  for (uint32_t c = 0; c < kClasses; ++c) cursor[c] = lists_.back(c);
  std::size_t added = 0;
  std::size_t hinted_seen = 0;
  std::vector<BlockKey> hinted_victims;
  while (added < count) {
    uint32_t best_c = kClasses;
    double best_priority = 0;
    for (uint32_t c = 0; c < kClasses; ++c) {
      if (cursor[c] == SlotLists::kNil) continue;
      const double p = priority(cursor[c]);
      if (best_c == kClasses || p < best_priority) {
        best_c = c;
        best_priority = p;
      }
    }
    if (best_c == kClasses) break;
    const uint32_t s = cursor[best_c];
    cursor[best_c] = lists_.newer(s);
    const BlockKey& key = index_.key(s);
    if (skip(key)) continue;
    if (hinted(key)) {
      // Kept while anything else can go; a last resort otherwise.
      if (hinted_seen++ < count) hinted_victims.push_back(key);
      continue;
    }
    out.push_back(key);
    ++added;
  }
  for (std::size_t i = 0; added < count && i < hinted_victims.size(); ++i, ++added) {
    out.push_back(hinted_victims[i]);
  }
  return added;
}

void LookaheadEvictor::describe(const BlockKey& key, BlockFacts& facts) const {
  const uint32_t slot = index_.find(key);
  if (slot == KeyIndex::kNone) return;
  facts.hits = std::max(facts.hits, uses_[slot] > 0 ? uses_[slot] - 1 : 0);
}

uint32_t LookaheadEvictor::uses_of(const BlockKey& key) const {
  const uint32_t slot = index_.find(key);
  return slot == KeyIndex::kNone ? ghost_.count(key) : uses_[slot];
}

std::size_t LookaheadEvictor::memory_bytes() const {
  return index_.memory_bytes() + lists_.memory_bytes() + links_.memory_bytes() +
         time_.capacity() * sizeof(uint64_t) + uses_.capacity() * sizeof(uint32_t) +
         class_.capacity() + ghost_.memory_bytes();
}

}  // namespace kvtier
