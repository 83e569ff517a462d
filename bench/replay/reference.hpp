// The two references of `kvtier-bench replay`, computed from the workload's dense block ids with
// no page table and no shared code with the policies, so a bug in either side shows as a gap:
//
//   ref_lru  one cache of `capacity` blocks; each request reuses its longest cached prefix, then
//            every block of the request is touched in order (a cached one moves to the front, a
//            missing one is inserted at the front and the least recently used block leaves);
//   opt      Belady's policy on the same model, computed offline: when a block must enter a full
//            cache, the block whose next use is furthest away leaves — the newcomer included, so a
//            block that is not used again before every cached one is not kept (bypass).
// Both return hit tokens (capped per request at its input_length). Single-threaded, O(accesses)
// for LRU and O(accesses log capacity) for OPT.
#pragma once

#include <cstdint>

#include "bench/replay/workload.hpp"

namespace kvtier::replay {

uint64_t reference_lru_hit_tokens(const ReplayWorkload& w, uint64_t capacity_blocks);
uint64_t belady_hit_tokens(const ReplayWorkload& w, uint64_t capacity_blocks);

}  // namespace kvtier::replay
