// The replay driver: one trace through the real page table, evictors and placement, metadata only
// (no KV bytes), at one set of tier capacities — or through one of the two references.
//
// Per request, in arrival order (the model of the trace's own reference numbers, so ref_lru and
// the lru policy agree):
//   1. hints: with lookahead N, the next N requests are on the HintBoard (keys and timestamps),
//      as an engine's waiting queue would be;
//   2. match(): the longest cached prefix is the hit, counted in tokens by the tier each block is
//      served from (capped at input_length);
//   3. every block of the request, parent first: a cached block is accessed in each tier holding
//      it, reported as a miss to each tier that does not (so every tier's evictor sees every
//      reference, in chain order), and promoted to HBM when it has no HBM copy; a missing block is
//      reported as a miss to every tier's evictor and computed into HBM — unless HBM is full and
//      its evictor refuses it (bypass), after which the rest of the chain is not retained either
//      (useless without it). Room is made by Placement plans executed at once
//      (execute_plan_metadata), cascading HBM -> host -> NVMe -> drop; the write strategy may copy
//      a new block down at once.
// Blocks whose copies are all gone are erased from the table (leaves first, then parents that
// became childless), so the table holds cached blocks and the uncached parents of cached ones.
// Nothing is pinned: a request longer than the cache may evict its own earlier blocks, as in the
// reference model. After the run the page table's audit() must pass and every evictor must report
// no misuse, or the run fails with a Status.
//
// Threading: one run per thread; runs share only the immutable workload and a progress counter.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bench/replay/workload.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::replay {

enum class RunKind : uint8_t { kPolicy, kReferenceLru, kBelady, kCountOracle };

struct RunSpec {
  RunKind kind = RunKind::kPolicy;
  EvictionPolicy eviction = EvictionPolicy::kLru;  // kPolicy only
  // Blocks per tier; 0 = the tier is absent. References use the sum, as one cache.
  std::array<uint64_t, kNumTiers> capacity_blocks{};
  uint64_t capacity_tokens = 0;  // as reported

  std::string policy_name() const;
};

struct RunOptions {
  uint32_t lookahead = 0;  // requests visible ahead on the hint board
  WritePolicy write = WritePolicy::kWriteBack;
  uint32_t write_selective_hits = 2;
  uint32_t nvme_min_hits = 0;
};

struct RunResult {
  std::string policy;
  uint64_t capacity_tokens = 0;
  uint64_t hit_tokens = 0;
  std::array<uint64_t, kNumTiers> hit_tokens_by_tier{};
  std::array<uint64_t, kReuseDistanceBuckets> hit_tokens_by_distance{};  // workload.hpp
  bool by_tier = true;  // false for references of a multi-tier run (one cache, no tiers)
  uint64_t total_tokens = 0;
  uint64_t bypassed_blocks = 0;  // newcomers an evictor refused

  double hit_rate() const {
    return total_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / total_tokens;
  }
  double distance_hit_rate(std::size_t bucket) const {
    return total_tokens == 0 ? 0.0
                             : static_cast<double>(hit_tokens_by_distance[bucket]) / total_tokens;
  }
  double tier_hit_rate(Tier t) const {
    return total_tokens == 0
               ? 0.0
               : static_cast<double>(hit_tokens_by_tier[static_cast<std::size_t>(tier_index(t))]) /
                     total_tokens;
  }
};

// `progress` (optional) is advanced by one per request replayed. A tier's capacity may exceed the
// trace: a tier gets at most one frame per distinct block of the trace (it cannot fill, so the
// hits are those of an unbounded tier either way); the result reports spec.capacity_tokens. Never
// throws: running out of memory is kResourceExhausted, any other exception kInternal.
Result<RunResult> run_replay(const ReplayWorkload& workload, const RunSpec& spec,
                             const RunOptions& options, std::atomic<uint64_t>* progress = nullptr);

// A token count as `kvtier-bench replay --capacities` takes it: a decimal number (digits, an
// optional fraction ".digits", an optional exponent "e" or "E" with an optional sign and digits)
// whose value is a whole number of tokens that fits in 64 bits, e.g. 1e6, 3e6, 1000000, 2.5e6
// (2500000) or 25000e-1 (2500). Nothing else: no sign, no spaces, no hex ("0x10", "0x1p20"), no
// inf or nan, no fraction of a token ("0.4", "25e-1"). Computed exactly from the digits, never
// through a double (strtod reads hex and rounds). kInvalidArgument, quoting `text`, otherwise.
Result<uint64_t> parse_token_count(std::string_view text);

}  // namespace kvtier::replay
