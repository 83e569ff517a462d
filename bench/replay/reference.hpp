// The three references of `kvtier-bench replay`, computed from the workload's dense block ids
// with no page table and no shared code with the policies, so a bug in either side shows as a gap:
//
//   ref_lru  one cache of `capacity` blocks; each request reuses its longest cached prefix, then
//            every block of the request is touched in order (a cached one moves to the front, a
//            missing one is inserted at the front and the least recently used block leaves);
//   opt      Belady's policy on the same model, computed offline: when a block must enter a full
//            cache, the block whose next use is furthest away leaves — the newcomer included, so a
//            block that is not used again before every cached one is not kept (bypass).
//   count_oracle
//            what knowing HOW OFTEN a block comes back buys, without knowing WHEN: each block's
//            number of references left in the trace is known, and so are the next `lookahead`
//            requests (the queue, exactly). A block read by a request in the queue is kept before
//            any other (the one read last goes first among those); the rest rank by references
//            left, then by recency, deeper blocks of a chain first; a newcomer ranking below
//            every cached block is not kept, nor the rest of its chain. It is what a policy would
//            do that knew every block's reuse rate exactly (on a trace whose reuses are close to a
//            Poisson process per prefix, about the best an online policy can aim for), so its gap
//            to opt is the part of opt's advantage that lies in timing alone. Not a bound: where
//            reuse follows soon after use (agent loops), recency beats it.
// All return hit tokens (capped per request at its input_length), in all and by reuse distance.
// Single-threaded, O(accesses) for LRU and O(accesses log capacity) for the others.
#pragma once

#include <cstdint>

#include "bench/replay/workload.hpp"

namespace kvtier::replay {

HitTally reference_lru_hits(const ReplayWorkload& w, uint64_t capacity_blocks);
HitTally belady_hits(const ReplayWorkload& w, uint64_t capacity_blocks);
HitTally count_oracle_hits(const ReplayWorkload& w, uint64_t capacity_blocks, uint32_t lookahead);

}  // namespace kvtier::replay
