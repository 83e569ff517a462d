#include "bench/replay/workload.hpp"

#include <array>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvtier::replay {
namespace {

uint8_t distance_bucket_of(uint64_t requests) {
  uint8_t b = 0;
  while (b < kReuseDistanceBounds.size() && requests > kReuseDistanceBounds[b]) ++b;
  return b;
}

}  // namespace

Result<ReplayWorkload> build_workload(const Trace& trace, uint32_t block_tokens) {
  if (block_tokens == 0 || kTraceBlockTokens % block_tokens != 0) {
    return invalid_argument("replay block size of " + std::to_string(block_tokens) +
                            " tokens must divide the trace's " + std::to_string(kTraceBlockTokens) +
                            "-token blocks");
  }
  const uint32_t per_id = kTraceBlockTokens / block_tokens;
  ReplayWorkload w;
  w.block_tokens = block_tokens;
  uint64_t total_blocks = 0;
  for (const TraceRequest& r : trace.requests) total_blocks += r.hash_ids.size() * per_id;
  w.keys.reserve(total_blocks);
  w.dense.reserve(total_blocks);
  w.distance_bucket.reserve(total_blocks);
  w.offsets.reserve(trace.requests.size() + 1);
  w.offsets.push_back(0);
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> ids;
  ids.reserve(total_blocks / 2 + 16);
  const BlockKey root = namespace_root("kvtier.replay");
  std::vector<uint64_t> last_request;  // per dense id: the request that referenced it last
  for (const TraceRequest& r : trace.requests) {
    const uint64_t request = w.input_tokens.size();
    BlockKey prev = root;
    for (uint64_t h : r.hash_ids) {
      for (uint32_t s = 0; s < per_id; ++s) {
        const std::array<uint32_t, 3> words = {static_cast<uint32_t>(h),
                                               static_cast<uint32_t>(h >> 32), s};
        const BlockKey key = chain_block_key(prev, words);
        const auto [it, inserted] = ids.try_emplace(key, static_cast<uint32_t>(ids.size()));
        if (inserted && ids.size() == std::numeric_limits<uint32_t>::max()) {
          return invalid_argument("trace " + trace.source + " has more than 2^32 - 1 blocks");
        }
        w.keys.push_back(key);
        w.dense.push_back(it->second);
        if (inserted) {
          last_request.push_back(request);
          w.distance_bucket.push_back(ReplayWorkload::kFirstReference);
        } else {
          w.distance_bucket.push_back(distance_bucket_of(request - last_request[it->second]));
          last_request[it->second] = request;
        }
        prev = key;
      }
    }
    w.offsets.push_back(w.keys.size());
    w.input_tokens.push_back(r.input_length);
    w.timestamps_ms.push_back(r.timestamp_ms);
    w.output_tokens.push_back(r.output_length);
    w.total_input_tokens += r.input_length;
  }
  w.unique_blocks = static_cast<uint32_t>(ids.size());
  // A block referenced before is cached in a cache that never evicts, and so is its prefix.
  for (std::size_t i = 0; i < w.requests(); ++i) {
    uint64_t k = w.offsets[i];
    while (k < w.offsets[i + 1] && w.distance_bucket[k] != ReplayWorkload::kFirstReference) ++k;
    w.tally_hit(i, k - w.offsets[i], w.reusable);
  }
  return w;
}

uint64_t ReplayWorkload::tally_hit(std::size_t i, uint64_t blocks, HitTally& tally) const {
  const uint64_t hit = hit_tokens(i, blocks);
  tally.tokens += hit;
  uint64_t left = hit;
  for (uint64_t k = offsets[i]; left > 0; ++k) {
    const uint64_t tokens = left < block_tokens ? left : block_tokens;
    if (distance_bucket[k] != kFirstReference) tally.by_distance[distance_bucket[k]] += tokens;
    left -= tokens;
  }
  return hit;
}

}  // namespace kvtier::replay
