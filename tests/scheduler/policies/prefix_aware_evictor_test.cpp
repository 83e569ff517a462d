// The prefix-aware policy and the chain links under it: a parent never leaves before its cached
// children, whatever order parents and children arrive, leave or come back in; random operations
// offer exactly the blocks with no cached child.
#include "scheduler/policies/prefix_aware_evictor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "scheduler/policies/chain_links.hpp"
#include "scheduler/policies/key_index.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

TEST(Evictors, PrefixAwareNeverEvictsAParentBeforeItsChildren) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  // Chain 1 -> 2 -> 3, then an unrelated newer block 9.
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2, 1, 1));
  e.on_insert(facts_of(3, 2, 2));
  e.on_insert(facts_of(9));
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  std::vector<BlockKey> out;
  // One walk gives up the whole chain, tail first, each parent right after its child.
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(3), key_of(2), key_of(1), key_of(9)}));
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(3));  // the chain's tail first
  // A child the walk's filter refuses (leaving in the same plan already) has left the walk: its
  // parent follows it.
  const auto tail_leaving = [](const BlockKey& k) { return k == key_of(3); };
  out.clear();
  ASSERT_EQ(e.select_victims(2, KeyFilter(tail_leaving), out), 2u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(2), key_of(1)}));
}

// A child that arrived before its parent (lower tiers receive chains leaf first, by demotion) is
// counted in the parent when it arrives: the parent, older in the walk, waits for its child.
TEST(Evictors, PrefixAwareParentArrivingAfterItsChildGoesAfterIt) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  e.on_insert(facts_of(2, 1, 1));  // the child, its parent not here yet
  e.on_insert(facts_of(1));
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  e.on_insert(facts_of(9));
  e.on_access(key_of(2));  // the child is now the newest: the walk meets its parent first
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(3, KeyFilter::none(), out), 3u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(9), key_of(2), key_of(1)}));
  e.on_erase(key_of(2));
  EXPECT_EQ(e.cached_children(key_of(1)), 0u);
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(e.misuse(), 0u);
}

// Tracks block `id` (child of `parent`) in `index` and attaches it to `links`; its slot.
uint32_t attach_block(KeyIndex& index, ChainLinks& links, uint64_t id, BlockKey parent) {
  const uint32_t slot = index.insert(key_of(id));
  links.reserve_slots(index.slot_limit());
  links.attach(index, slot, parent);
  return slot;
}

// A parent that left and came back into another slot whose per-slot generation matched the
// stale link's: the link must be recognised as stale and the child counted again.
TEST(Evictors, ChainLinksParentBackInAnotherSlotRecountsItsChild) {
  KeyIndex index;
  ChainLinks links;
  const auto add = [&](uint64_t id, BlockKey parent) {
    return attach_block(index, links, id, parent);
  };
  const uint32_t p = add(1, BlockKey{});
  const uint32_t c = add(2, key_of(1));
  EXPECT_EQ(links.parent_slot(index, c), p);
  EXPECT_EQ(links.children(p), 1u);
  links.detach(index, p);
  index.erase(p);
  EXPECT_EQ(add(3, BlockKey{}), p);  // the parent's old slot, now someone else's
  const uint32_t p2 = add(1, BlockKey{});
  ASSERT_NE(p2, p);
  EXPECT_EQ(links.parent_slot(index, c), p2);
  EXPECT_EQ(links.children(p2), 1u);
  links.detach(index, c);
  EXPECT_EQ(links.children(p2), 0u);
  EXPECT_EQ(links.children(p), 0u);
}

// A child that arrives before its parent waits for it and is counted the moment the parent
// arrives, with no walk asking for the child; a waiting child that leaves first is not counted.
TEST(Evictors, ChainLinksCountAChildThatArrivedFirstWhenItsParentArrives) {
  KeyIndex index;
  ChainLinks links;
  const auto add = [&](uint64_t id, BlockKey parent) {
    return attach_block(index, links, id, parent);
  };
  add(2, key_of(1));  // children of 1, before it
  add(3, key_of(1));
  const uint32_t gone = add(4, key_of(1));
  links.detach(index, gone);
  index.erase(gone);
  const uint32_t grandchild = add(5, key_of(2));  // linked at once: 2 is here
  EXPECT_EQ(links.children(index.find(key_of(2))), 1u);
  const uint32_t p = add(1, BlockKey{});
  EXPECT_EQ(links.children(p), 2u);
  EXPECT_EQ(links.parent_slot(index, index.find(key_of(2))), p);
  EXPECT_EQ(links.children(p), 2u);  // asking again counts nothing twice
  links.detach(index, index.find(key_of(3)));
  EXPECT_EQ(links.children(p), 1u);
  links.detach(index, grandchild);
  EXPECT_EQ(links.children(index.find(key_of(2))), 0u);
}

// Thousands of children waiting for one absent parent (a lower tier holding the branches of a
// shared prompt) leave in any order, each in O(1): the parent then counts exactly the ones
// left, and one that left never comes back through a reused slot.
TEST(Evictors, ChainLinksChildrenWaitingForOneParentLeaveInAnyOrder) {
  KeyIndex index;
  ChainLinks links;
  constexpr uint64_t kChildren = 4000;
  std::vector<uint32_t> slots;
  for (uint64_t id = 2; id < 2 + kChildren; ++id) {
    slots.push_back(attach_block(index, links, id, key_of(1)));
  }
  attach_block(index, links, 100000, key_of(900000));  // waits for another parent
  EXPECT_EQ(links.awaited_parents(), 2u);
  std::mt19937_64 rng(7);
  std::shuffle(slots.begin(), slots.end(), rng);
  const std::size_t leaving = kChildren / 2 + 1;
  for (std::size_t i = 0; i < leaving; ++i) {
    links.detach(index, slots[i]);
    index.erase(slots[i]);
  }
  // Reused slots, children of nobody here: not counted for 1.
  for (uint64_t id = 200000; id < 200010; ++id) attach_block(index, links, id, BlockKey{});
  const uint32_t p = attach_block(index, links, 1, BlockKey{});
  EXPECT_EQ(links.children(p), kChildren - leaving);
  EXPECT_EQ(links.awaited_parents(), 1u);
  for (std::size_t i = leaving; i < slots.size(); ++i) {
    EXPECT_EQ(links.parent_slot(index, slots[i]), p);
    links.detach(index, slots[i]);
  }
  EXPECT_EQ(links.children(p), 0u);
  // Every child of 1 left before 1 did: the last waiting list empties too.
  links.detach(index, index.find(key_of(100000)));
  EXPECT_EQ(links.awaited_parents(), 0u);
}

TEST(Evictors, PrefixAwareParentBackInAnotherSlotWaitsForItsChild) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  e.on_insert(facts_of(1));        // slot 0
  e.on_insert(facts_of(2, 1, 1));  // slot 1, linked to 1
  e.on_erase(key_of(1));
  e.on_insert(facts_of(3));  // slot 0 again
  e.on_insert(facts_of(1));  // slot 2
  e.on_insert(facts_of(4));  // unrelated, touched last
  e.on_access(key_of(2));    // the newest: the walk meets its parent first
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  std::vector<BlockKey> out;
  // Counted again, the parent waits for its child; taken as a leaf it would go second.
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(3), key_of(4), key_of(2), key_of(1)}));
  e.on_erase(key_of(2));
  EXPECT_EQ(e.cached_children(key_of(1)), 0u);
  EXPECT_EQ(e.misuse(), 0u);
}

// Random inserts (parents before or after their children), accesses, erases and refusals against
// a map of who is whose parent: a block is never offered before a tracked child of it that the
// filter allows, and every tracked block the filter allows is (up to the count asked: in chains,
// each parent follows its child within the walk).
TEST(Evictors, PrefixAwareRandomOpsOfferExactlyTheFreeLeaves) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    std::mt19937_64 rng(seed);
    EvictorOptions o;
    PrefixAwareEvictor e(o);
    // Chains of 6: id's parent is id - 1 unless id % 6 == 1.
    const auto parent_of = [](uint64_t id) { return id % 6 == 1 ? uint64_t{0} : id - 1; };
    std::set<uint64_t> tracked;
    for (int op = 0; op < 4000; ++op) {
      const uint64_t id = 1 + rng() % 60;
      switch (rng() % 4) {
        case 0:
        case 1:
          if (tracked.count(id)) {
            e.on_access(key_of(id));
          } else {
            const uint64_t p = parent_of(id);
            e.on_insert(p == 0 ? facts_of(id) : facts_of(id, p, 1));
            tracked.insert(id);
          }
          break;
        case 2:
          if (tracked.count(id)) {
            e.on_erase(key_of(id));
            tracked.erase(id);
          }
          break;
        default: {
          const uint64_t salt = rng();
          const auto refused = [salt](const BlockKey& k) {
            return policy_key_hash(BlockKey{k.lo ^ salt, k.hi}) % 4 == 0;
          };
          std::size_t allowed = 0;
          for (uint64_t t : tracked) allowed += refused(key_of(t)) ? 0 : 1;
          const std::size_t want = 1 + rng() % 8;
          std::vector<BlockKey> out;
          const std::size_t got = e.select_victims(want, KeyFilter(refused), out);
          ASSERT_EQ(got, std::min(want, allowed)) << "seed " << seed << " op " << op;
          std::set<uint64_t> offered;
          for (const BlockKey& k : out) {
            ASSERT_TRUE(tracked.count(k.lo));
            ASSERT_FALSE(refused(k));
            const uint64_t child = k.lo + 1;
            const bool child_first = !tracked.count(child) || parent_of(child) != k.lo ||
                                     refused(key_of(child)) || offered.count(child) != 0;
            ASSERT_TRUE(child_first) << "seed " << seed << " op " << op << ": offered " << k.lo
                                     << " before its cached child";
            offered.insert(k.lo);
          }
          // The caller evicts only some of what it was offered.
          for (const BlockKey& k : out) {
            if (rng() % 2 == 0) continue;
            e.on_erase(k);
            tracked.erase(k.lo);
          }
        }
      }
    }
    EXPECT_EQ(e.misuse(), 0u);
  }
}

}  // namespace
}  // namespace kvtier::testing
