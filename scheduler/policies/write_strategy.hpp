// WriteStrategy: when a block's KV is copied down to the slower tiers (policies.write).
//
//   write_through            every completed block is written down at once, so eviction from
//                            HBM is always a plain drop (a clean copy waits below);
//   write_back               nothing is written until eviction: the placement demotes the
//                            victim (a copy plus a drop), the cheapest on links when most blocks
//                            are never reused; a copy left below a promoted block is the first
//                            to go when its tier needs room (ShadowedFirstEvictor);
//   write_through_selective  written down once the block has been hit `write_selective_hits`
//                            times: blocks that proved popular get a clean copy below early, so
//                            their later eviction is free, while one-off blocks cost nothing.
//
// The scheduler asks on two events, block completion (end_step) and hit (match), and gets the
// lower tiers to copy the block to now; it carries those writes out asynchronously, at the lowest
// priority (demand loads before prefetches before write-backs), and skips tiers that already hold
// a copy or refuse it (NvmeAdmission). Stateless apart from its options, so one instance serves
// every tier and thread. Rejected: letting the strategy start the copies itself (it would need
// the transfer engines; the scheduler already orders and throttles all transfers).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "kvtier/config.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

// A set of tiers, bit tier_index(t).
class TierMask {
 public:
  constexpr TierMask() = default;
  static constexpr TierMask of(Tier t) { return TierMask(1u << tier_index(t)); }
  static constexpr TierMask below(Tier t) {  // every tier slower than t
    uint8_t bits = 0;
    for (int i = tier_index(t) + 1; i < kNumTiers; ++i) bits |= static_cast<uint8_t>(1u << i);
    return TierMask(bits);
  }
  constexpr bool has(Tier t) const { return (bits_ >> tier_index(t)) & 1u; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr TierMask with(Tier t) const { return TierMask(bits_ | (1u << tier_index(t))); }
  constexpr TierMask without(Tier t) const {
    return TierMask(bits_ & static_cast<uint8_t>(~(1u << tier_index(t))));
  }
  constexpr uint8_t bits() const { return bits_; }
  friend constexpr bool operator==(TierMask, TierMask) = default;

 private:
  constexpr explicit TierMask(uint32_t bits) : bits_(static_cast<uint8_t>(bits)) {}
  uint8_t bits_ = 0;
};

// What a write decision reads about the block.
struct WriteContext {
  uint32_t hits = 0;   // times a request reused the block (AccessStats::hits)
  TierMask present;    // tiers holding a ready or filling copy of every page
  TierMask available;  // tiers configured below HBM (capacity > 0)
};

class WriteStrategy {
 public:
  virtual ~WriteStrategy() = default;
  virtual std::string_view name() const = 0;
  // A full block has just been completed in HBM: tiers to copy it to now.
  virtual TierMask on_complete(const WriteContext& block) const = 0;
  // A request has just reused the block (its `hits` already counts this one): tiers to copy to.
  virtual TierMask on_hit(const WriteContext& block) const = 0;
  // Whether an evicted copy with no clean copy below must be written down before it is dropped
  // (true for every strategy here; a cache that may lose unwritten blocks could say false).
  virtual bool demote_on_evict() const { return true; }
  // Whether copies below a block that a faster tier holds are wanted there (true for the
  // strategies that write blocks down ahead of eviction, so that eviction is a plain drop); false
  // lets a lower tier give up such a shadowed copy before any block only it holds
  // (ShadowedFirstEvictor): under write_back the copies below a promoted block are left-overs.
  virtual bool keeps_shadowed_copies() const { return true; }
};

// `selective_hits` is policies.write_selective_hits (used by write_through_selective only).
std::unique_ptr<WriteStrategy> make_write_strategy(WritePolicy policy, uint32_t selective_hits);

std::string_view write_policy_name(WritePolicy policy);

}  // namespace kvtier
