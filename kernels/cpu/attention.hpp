// Paged attention on the CPU: decode (one query token per sequence) and chunked causal prefill,
// over the frames of a block table (kernels/attention_params.hpp has the contract and layouts).
//
// This is both the CPU backend and the oracle the CUDA kernels are tested against. Work is split
// into items (sequence x block of query tokens x KV range, all KV heads of a token together so
// each item streams whole page rows) and run with oneTBB in the caller's task arena. Long
// sequences are split along the KV axis ("split-K") so that one sequence uses every core; the
// partial softmax states are merged exactly afterwards. Within an item, K and V are read in place
// (widened in registers), scored in register blocks and prefetched one step ahead, so a decode
// item costs one pass over its bytes plus arithmetic that the prefetching overlaps (isa_core.inl
// has the measurements). GQA groups share every K/V load; a group of 8 is compute bound.
//
// Calls are independent and may run concurrently from several threads (scratch is per thread).
// Bad input is reported as a Status before any page is read; with the residency guard enabled a
// non-resident frame is reported the same way (failed_precondition naming the frame).
#pragma once

#include "kernels/attention_params.hpp"
#include "kernels/cpu/isa.hpp"
#include "kvtier/status.hpp"

namespace kvtier::kernels::cpu {

struct CpuOptions {
  Isa isa = Isa::kAuto;  // a specific ISA the CPU lacks is `unavailable`
  // KV tokens per split of one sequence (a long sequence is cut into splits that run in parallel
  // and are merged exactly); 0 = the default (1024). Smaller means more parallelism for few long
  // sequences, at the cost of merging more partial states. Results depend on this value and the
  // inputs only, not on threads or batching.
  uint32_t min_split_tokens = 0;
};

// Decode: p.q_indptr must be nullptr; rows = batch.
Status decode_attention(const AttentionParams& p, const CpuOptions& options = {});

// Chunked prefill: p.q_indptr is required; rows = q_indptr[batch].
Status prefill_attention(const AttentionParams& p, const CpuOptions& options = {});

}  // namespace kvtier::kernels::cpu
