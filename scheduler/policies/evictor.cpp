#include "scheduler/policies/evictor.hpp"

#include "scheduler/policies/lfu_evictor.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/lru_evictor.hpp"
#include "scheduler/policies/prefix_aware_evictor.hpp"
#include "scheduler/policies/s3fifo_evictor.hpp"

namespace kvtier {

std::unique_ptr<Evictor> make_evictor(EvictionPolicy policy, const EvictorOptions& options) {
  switch (policy) {
    case EvictionPolicy::kLru: return std::make_unique<LruEvictor>(options);
    case EvictionPolicy::kLfu: return std::make_unique<LfuEvictor>(options);
    case EvictionPolicy::kS3Fifo: return std::make_unique<S3FifoEvictor>(options);
    case EvictionPolicy::kPrefixAware: return std::make_unique<PrefixAwareEvictor>(options);
    case EvictionPolicy::kLookahead: return std::make_unique<LookaheadEvictor>(options);
  }
  return std::make_unique<LruEvictor>(options);
}

std::array<std::unique_ptr<Evictor>, kNumTiers> make_tier_evictors(
    EvictionPolicy policy, const std::array<std::optional<EvictorOptions>, kNumTiers>& tiers) {
  std::array<std::unique_ptr<Evictor>, kNumTiers> out;
  int last = kNumTiers - 1;
  while (last >= 0 && !tiers[last]) --last;
  if (last < 0) return out;
  if (policy != EvictionPolicy::kLookahead) {
    for (int t = 0; t <= last; ++t) {
      if (tiers[t]) out[t] = make_evictor(policy, *tiers[t]);
    }
    return out;
  }
  auto history = std::make_unique<LookaheadEvictor>(*tiers[last]);
  const LookaheadEvictor* shared = history.get();
  out[last] = std::move(history);
  for (int t = 0; t < last; ++t) {
    if (tiers[t]) out[t] = std::make_unique<LookaheadEvictor>(*tiers[t], shared);
  }
  return out;
}

std::string_view eviction_policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kLru: return "lru";
    case EvictionPolicy::kLfu: return "lfu";
    case EvictionPolicy::kS3Fifo: return "s3fifo";
    case EvictionPolicy::kPrefixAware: return "prefix_aware";
    case EvictionPolicy::kLookahead: return "lookahead";
  }
  return "unknown";
}

}  // namespace kvtier
