// ReplayWorkload: a trace turned into what the replay feeds the page table — the block keys of
// every request, at the replay's block granularity.
//
// Each trace id stands for a 512-token block with its whole prefix; at `block_tokens` tokens per
// replay block (the geometry's page_tokens, which must divide 512) it becomes 512 / block_tokens
// blocks. Keys are chained like real block keys (scheduler/block_key.cpp): the first block's
// parent is the namespace root of "kvtier.replay", and block s of id h is
// chain_block_key(previous key, {low32(h), high32(h), s}), so equal id prefixes give equal keys,
// deterministically across runs. The last trace block of a prompt is usually partial; the trace
// still names it by an id like any other, so it is replayed as a whole block and a request's hit
// is capped at its input_length (the convention of the trace's own reference numbers). The dense
// ids (0..unique-1, in order of first appearance) serve the reference simulators, which need no
// hashing. Immutable once built; shared read-only by the replay threads.
//
// Reuse distance: each block reference records how many requests back the same block was last
// referenced (1 = the request before), in the buckets below. A hit is tallied per matched block
// by that distance (HitTally), which says where a policy's hits come from and what is left: a
// cache that holds a block for about `capacity / new blocks per request` requests hits little
// past that distance unless it knows which blocks come back. `reusable` is what a cache that
// never evicts would hit (the trace's infinite-cache prefix hit), by the same buckets.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "bench/replay/trace.hpp"
#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"

namespace kvtier::replay {

// Upper bounds (in requests, inclusive) of the reuse-distance buckets; the last bucket is open.
inline constexpr std::array<uint32_t, 4> kReuseDistanceBounds = {32, 128, 512, 2048};
inline constexpr std::size_t kReuseDistanceBuckets = kReuseDistanceBounds.size() + 1;
// Names of the buckets, as the table and the JSON print them.
inline constexpr std::array<std::string_view, kReuseDistanceBuckets> kReuseDistanceNames = {
    "1-32", "33-128", "129-512", "513-2048", "2049+"};

// Hit tokens, in all and by the reuse distance of the matched blocks.
struct HitTally {
  uint64_t tokens = 0;
  std::array<uint64_t, kReuseDistanceBuckets> by_distance{};
};

struct ReplayWorkload {
  // distance_bucket of a block's first reference (it cannot hit).
  static constexpr uint8_t kFirstReference = 0xff;

  uint32_t block_tokens = 16;
  std::vector<BlockKey> keys;            // every request's blocks, concatenated in request order
  std::vector<uint32_t> dense;           // dense id of each entry of `keys`
  std::vector<uint8_t> distance_bucket;  // reuse-distance bucket of each entry of `keys`
  std::vector<uint64_t> offsets;         // request i owns [offsets[i], offsets[i + 1])
  std::vector<uint64_t> input_tokens;    // per request
  std::vector<uint64_t> timestamps_ms;
  // Per request: the tokens it generated (the trace's output_length).
  std::vector<uint64_t> output_tokens;
  uint32_t unique_blocks = 0;
  uint64_t total_input_tokens = 0;
  HitTally reusable;  // what a cache that never evicts hits

  std::size_t requests() const { return input_tokens.size(); }
  std::span<const BlockKey> request_keys(std::size_t i) const {
    return {keys.data() + offsets[i], keys.data() + offsets[i + 1]};
  }
  std::span<const uint32_t> request_dense(std::size_t i) const {
    return {dense.data() + offsets[i], dense.data() + offsets[i + 1]};
  }
  // Tokens a request reuses when its first `blocks` blocks are cached.
  uint64_t hit_tokens(std::size_t i, uint64_t blocks) const {
    const uint64_t t = blocks * block_tokens;
    return t < input_tokens[i] ? t : input_tokens[i];
  }
  // Adds the hit of request i with its first `blocks` blocks cached to `tally`, each matched
  // block's tokens (the last ones capped at input_length) under its reuse distance; returns the
  // request's hit tokens. A matched block with no earlier reference (a caller's bug) is counted
  // in tally.tokens only, so the buckets then fall short of it.
  uint64_t tally_hit(std::size_t i, uint64_t blocks, HitTally& tally) const;
};

// kInvalidArgument when block_tokens is 0 or does not divide 512, or the trace has more unique
// blocks than 32-bit dense ids can number.
Result<ReplayWorkload> build_workload(const Trace& trace, uint32_t block_tokens);

}  // namespace kvtier::replay
