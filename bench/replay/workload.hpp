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
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bench/replay/trace.hpp"
#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"

namespace kvtier::replay {

struct ReplayWorkload {
  uint32_t block_tokens = 16;
  std::vector<BlockKey> keys;          // every request's blocks, concatenated in request order
  std::vector<uint32_t> dense;         // dense id of each entry of `keys`
  std::vector<uint64_t> offsets;       // request i owns [offsets[i], offsets[i + 1])
  std::vector<uint64_t> input_tokens;  // per request
  std::vector<uint64_t> timestamps_ms;
  uint32_t unique_blocks = 0;
  uint64_t total_input_tokens = 0;

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
};

// kInvalidArgument when block_tokens is 0 or does not divide 512, or the trace has more unique
// blocks than 32-bit dense ids can number.
Result<ReplayWorkload> build_workload(const Trace& trace, uint32_t block_tokens);

}  // namespace kvtier::replay
