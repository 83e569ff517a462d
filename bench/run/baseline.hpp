// The four configurations every run compares, on the same workload and the same modeled server:
//
//   recompute  no reuse: the engine gives the cache no content keys, so every prompt is computed
//              from its first token (prefix caching off). HBM only.
//   hbm_lru    an HBM-only prefix cache with LRU eviction: what a serving engine's built-in prefix
//              caching does. An evicted block is gone.
//   hbm_host   HBM plus pinned host memory, LRU in both, blocks evicted from HBM demoted to host
//              and loaded back on a hit, loads started when the request starts: what host-memory
//              offloading connectors do. No hints, no NVMe.
//   kvtier     every tier (HBM, host, NVMe) and the configured policies (eviction, write,
//              admission, prefetch depth and layer window, late-load handling), with the engine's
//              waiting queue given as hints so prefetch and lookahead work.
// In all four the scheduler, page table and policies are kvtier's own, and compute-or-load uses
// the modeled prefill speed, so the differences are the tiers and the policies, nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier::bench::run {

enum class BaselineKind : uint8_t { kRecompute = 0, kHbmLru, kHbmHost, kKvtier };

struct BaselineSpec {
  BaselineKind kind = BaselineKind::kKvtier;
  std::string name;
  std::string summary;  // one line for the report
  bool reuse = true;    // the engine gives content keys (prefix caching on)
  bool host = true;
  bool nvme = true;
  bool hints = true;  // the waiting queue is hinted (prefetch, lookahead)
  PoliciesConfig policies;
};

std::string_view baseline_name(BaselineKind kind);

// The baselines named in `names` (comma-separated; empty = all four, in the order above), the
// kvtier one with `configured` policies. kInvalidArgument names an unknown baseline.
Result<std::vector<BaselineSpec>> make_baselines(std::string_view names,
                                                 const PoliciesConfig& configured,
                                                 double prefill_tokens_per_s);

}  // namespace kvtier::bench::run
