// The plain values of the step contract (DESIGN.md, "How an engine uses it"), shared by the
// scheduler and the public Runtime API: sequences and steps are named by ids, a step's per-layer
// block tables are CSR arrays of HBM frame indices (FlashInfer-style: the pages of batch item i
// are indices[indptr[i] .. indptr[i+1]), the last of them holding last_page_len[i] tokens).
// No behaviour here; see include/kvtier/kvtier.hpp for the calls that produce and take them.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

using SequenceId = uint64_t;
using StepId = uint64_t;

// The cached prefix of a key chain: its length in blocks, and how many of those blocks sit in each
// tier (counted in the slowest tier each must be loaded from; index with tier_index()).
struct MatchResult {
  uint32_t blocks = 0;
  std::array<uint32_t, kNumTiers> by_tier{};
  friend bool operator==(const MatchResult&, const MatchResult&) = default;
};

struct OpenedSequence {
  SequenceId id = 0;
  uint32_t prompt_blocks = 0;   // keys given
  uint32_t matched_blocks = 0;  // cached prefix found
  uint32_t reused_blocks = 0;   // what the sequence reuses; the engine prefills the rest
  uint64_t reused_tokens = 0;   // reused_blocks * page_tokens: the engine starts prefill here
  std::array<uint32_t, kNumTiers> reused_by_tier{};  // where the reused blocks were found
  uint32_t recompute_blocks = 0;  // matched, but cheaper to recompute than to load
};

struct StepItem {
  SequenceId sequence = 0;
  uint32_t new_tokens = 0;  // tokens whose K/V the engine writes this step (prefill chunk or 1)
};

// Per batch item, in request order.
struct StepItemInfo {
  SequenceId sequence = 0;
  uint64_t context_tokens = 0;  // tokens with K/V before this step; the engine writes from here
  // Tokens the engine writes this step: the new_tokens it asked for, plus `recomputed_tokens` in
  // front of them when prefetch.on_late = recompute gave up a reused prefix that was loading too
  // slowly (decided at the first step of a sequence), or when a block the sequence reads was lost
  // to a failed NVMe read (any step: that block and the ones after it, prompt or generated
  // tokens). Reported again by the next begin_step when that step failed or was aborted, until a
  // step that recomputes them ends; the engine writes from context_tokens.
  uint32_t new_tokens = 0;
  uint32_t recomputed_tokens = 0;
  uint32_t pages = 0;  // pages per layer this step reads and writes
};

struct StepInfo {
  StepId id = 0;
  uint32_t layers = 0;
  uint32_t window = 0;  // layers pinned at once (== layers when the batch fits in HBM)
  bool windowed = false;
  std::vector<StepItemInfo> items;
};

struct LayerTable {
  std::vector<int32_t> indptr;         // [batch + 1]
  std::vector<int32_t> indices;        // [indptr[batch]] HBM frame indices
  std::vector<int32_t> last_page_len;  // [batch] tokens in each item's last page, 1..page_tokens
};

// Given at end_step for an item whose tokens filled blocks: the content keys of the blocks the
// step filled, in order from the block its first token went into (full_block_keys[j] names block
// context_tokens / page_tokens + j). Prompt blocks may be named too but must match the prompt key;
// a mismatch or more keys than filled blocks is kInvalidArgument and publishes none of them.
// Omitted or short: the prompt keys given at open are used; a block with no key stays private.
struct StepCompletion {
  SequenceId sequence = 0;
  std::vector<BlockKey> full_block_keys;
};

// A request waiting in the engine's queue (hint): its keys and expected start, in nanoseconds on
// the runtime's clock (steady_clock for a real runtime).
struct HintedRequest {
  uint64_t request_id = 0;
  int64_t expected_start_ns = 0;
  std::vector<BlockKey> keys;
};

}  // namespace kvtier
