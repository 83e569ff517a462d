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
