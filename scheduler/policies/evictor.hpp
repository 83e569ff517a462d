// Evictor: the eviction policy of ONE tier. It tracks the blocks that have a copy in its tier and
// answers two questions when that tier is short of frames: may this newcomer take a frame at all
// (admit), and which present blocks should leave first (select_victims).
//
// Who calls it. The scheduler's event loop (or the trace replay) owns one Evictor per tier and is
// its only caller: evictors are not thread-safe and hold no lock. The page table stays the truth
// about copies and pins; an evictor only ranks. The caller reports every change of membership:
//   on_insert  a copy of the block became ready in this tier (filled, promoted or demoted into it);
//   on_access  a request used the block while it has a copy here (match, or prefill re-deriving
//              it); the accesses of one request come in chain order, parent first;
//   on_erase   the copy left this tier (evicted by a plan, or dropped for any other reason);
//   on_miss    a request needed the block and this tier had no copy (before any insert): lets a
//              policy learn reuse of blocks it does not hold (ghost histories);
//   on_shadowed  a faster tier gained or lost a ready copy of every page of a tracked block
//                (policies that order such copies first: ShadowedFirstEvictor);
//   on_released  no open sequence holds a tracked block any more (policies that keep the blocks
//                of open sequences, EvictorOptions::in_use, rank it again);
//   on_request_end  a request that referenced a chain of blocks ended, having generated so many
//                   tokens (the lookahead policy classes the blocks it used first by that).
// A key is tracked from on_insert to on_erase; on_insert of a tracked key or on_erase/on_access
// of an untracked one is a caller bug and is ignored (counted in `misuse()`), never a crash.
//
// Victims. select_victims appends distinct tracked keys in the order the policy wants them gone,
// skipping any for which `skip` says true (pinned pages, copies in flight, blocks already in the
// plan being built). A victim stays tracked until the caller reports on_erase, so a plan that is
// abandoned needs no undo. The placement logic (scheduler/placement.hpp) turns victims into moves.
//
// Bypass. admit() is asked before a NEW block takes a frame in a full tier. Belady's policy keeps
// a block only if it will be used again before the block it would displace; a policy that can
// predict reuse (lookahead) refuses newcomers that would be worth less than its current victim.
// In HBM a refused block still exists for the step that computes it; it is simply not retained.
//
// Metadata. Policies keep per-block state in flat arrays indexed through a KeyIndex (about 40
// bytes per tracked block and tier for the list-based policies), because the tables hold 10^6 to
// 10^7 blocks. Rejected: one std::list node per block (48+ bytes and a heap allocation each), and
// reading AccessStats from the page table at eviction time (a full scan per decision and a shard
// lock per candidate).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/config.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

class HintBoard;

// Where the policy of the tier a block leaves ranked it, for a policy whose ranks mean the same in
// every tier (lookahead: the time the block ranks from and the class whose learned gap shifts it).
// The tier it is demoted into ranks it from there, so the tiers together keep one order, as one
// cache of their summed size would.
struct CarriedRank {
  uint64_t time = 0;
  uint8_t cls = 0;
};

// What the caller knows about a block when it enters a tier.
struct BlockFacts {
  BlockKey key;
  BlockKey parent;     // null for the first block of a chain
  uint32_t depth = 0;  // blocks before this one in its chain
  // The request that produced or fetched this block matched a cached prefix of this many blocks
  // (0: the request started cold). A block computed after a long cached prefix is a new branch
  // of a known conversation; one computed by a cold request is the start of a possible new one.
  uint32_t request_hit_blocks = 0;
  // Blocks in the request that produced or fetched this block (its chain length there).
  uint32_t request_blocks = 0;
  // Times requests reused the block so far (AccessStats::hits), so a tier it moves into can
  // seed its frequency estimate.
  uint32_t hits = 0;
  // True when the block came down from a faster tier (demotion) rather than being computed or
  // promoted into this one.
  bool demoted = false;
  // The faster tier's rank for it (describe() of a policy that has one); read on demotion.
  std::optional<CarriedRank> rank;
};

// A non-owning callable `bool(const BlockKey&)`: true means "do not choose this key now". Cheaper
// than std::function on the victim walk (no allocation, one indirect call).
class KeyFilter {
 public:
  template <typename F>
  KeyFilter(const F& f)  // NOLINT(google-explicit-constructor): passed as a lambda at call sites
      : object_(&f),
        call_([](const void* o, const BlockKey& k) { return (*static_cast<const F*>(o))(k); }) {}
  bool operator()(const BlockKey& key) const { return call_(object_, key); }

  // A filter that skips nothing.
  static KeyFilter none() {
    static constexpr auto kNone = [](const BlockKey&) { return false; };
    return KeyFilter(kNone);
  }

 private:
  const void* object_;
  bool (*call_)(const void*, const BlockKey&);
};

class Evictor {
 public:
  virtual ~Evictor() = default;

  virtual std::string_view name() const = 0;

  virtual void on_insert(const BlockFacts& block) = 0;
  virtual void on_access(const BlockKey& key) = 0;
  virtual void on_erase(const BlockKey& key) = 0;
  virtual void on_miss(const BlockFacts& block) {}
  // A tier faster than this one now holds (true), or no longer holds (false), a ready copy of
  // every page of this tracked block: this tier's copy could go without losing it. Reported
  // where a policy orders such copies first (ShadowedFirstEvictor); the default ignores it.
  virtual void on_shadowed(const BlockKey& key, bool shadowed) {}
  // The last open sequence that held this tracked block let it go (EvictorOptions::in_use now
  // says false). The default ignores it.
  virtual void on_released(const BlockKey& key) {}
  // A request ended: it referenced `keys` (its chain, parent first; tracked or not) and generated
  // `output_tokens` tokens after its prompt. Reported once per request, after its references.
  // The default ignores it.
  virtual void on_request_end(std::span<const BlockKey> keys, uint64_t output_tokens) {}

  // Whether `block` (not yet tracked) should take a frame when the tier is full. The default
  // admits everything.
  virtual bool admit(const BlockFacts& block) { return true; }

  // Appends up to `count` distinct tracked keys, best victim first, skipping keys `skip` refuses.
  // Returns how many were appended (fewer when the policy has no more candidates).
  virtual std::size_t select_victims(std::size_t count, KeyFilter skip,
                                     std::vector<BlockKey>& out) = 0;

  // Fills what the policy remembers of a tracked block (hits, its rank) into `facts`, whose key
  // and parent the caller has set; used to carry a block's facts along when it is demoted. The
  // default remembers nothing.
  virtual void describe(const BlockKey& key, BlockFacts& facts) const {}

  virtual bool contains(const BlockKey& key) const = 0;
  virtual std::size_t size() const = 0;
  // Heap bytes of the policy's metadata.
  virtual std::size_t memory_bytes() const = 0;
  // Calls that broke the membership contract (see the header comment); 0 in a correct caller.
  virtual uint64_t misuse() const { return misuse_; }

 protected:
  void count_misuse() { ++misuse_; }

 private:
  uint64_t misuse_ = 0;
};

struct EvictorOptions {
  // Frames of the tier, used to size queues (S3-FIFO's small queue and ghost, the lookahead
  // policy's reuse estimates). 0 is allowed (a tier that holds nothing).
  uint64_t capacity_blocks = 0;
  // Frames of the whole cache the tier belongs to: every configured tier's, summed (0: the tier
  // alone). A block leaves the cache only from its last tier, so that tier should rank as one
  // cache of that size would: the lookahead policy measures the last tier's reuse horizon and the
  // cache's one ghost in it (the tiers above, built by make_tier_evictors, their horizon in their
  // own frames).
  uint64_t cache_blocks = 0;
  // Expected number of tracked blocks, to presize indexes (0: grow on demand).
  uint64_t expected_blocks = 0;
  // Future knowledge for `lookahead`: the keys of requests waiting in the engine's queue. Not
  // owned; must outlive the evictor. Null: the lookahead policy runs purely online.
  const HintBoard* hints = nullptr;
  // Present knowledge for `lookahead`: true for a block that an open sequence holds, which its
  // next step reads (every step reads all of its sequence's KV). Empty: none is known (the trace
  // replay, whose requests end as they start). Called on the scheduler's loop for victim
  // candidates only.
  std::function<bool(const BlockKey&)> in_use;
};

// The evictor named by the configuration (policies.eviction), for a tier on its own.
std::unique_ptr<Evictor> make_evictor(EvictionPolicy policy, const EvictorOptions& options);

// The evictors of one cache's tiers, fastest first: the policy's evictor for each tier that has
// options, null for the others. Tiers built together share what each would otherwise keep of the
// whole cache: the lookahead policy's tiers above the last read the history of blocks they do not
// hold (last reference, use count, class) from the last tier, which hears every reference just
// after them, instead of each keeping a ghost of the whole cache's size. So they must live and die
// together, and every reference must reach them in tier order (the callers' loops do both).
std::array<std::unique_ptr<Evictor>, kNumTiers> make_tier_evictors(
    EvictionPolicy policy, const std::array<std::optional<EvictorOptions>, kNumTiers>& tiers);

// Config names ("lru", "lfu", "s3fifo", "prefix_aware", "lookahead").
std::string_view eviction_policy_name(EvictionPolicy policy);

}  // namespace kvtier
