// Parameters of paged attention, shared by the CPU kernels (kernels/cpu/attention.hpp) and the
// CUDA launchers (kernels/cuda/attention_cuda.hpp). Plain values passed by value; no ownership.
//
// Decode: one query token per sequence (q_indptr == nullptr); it attends to every cached token.
// Prefill (chunked, causal): sequence b has q_indptr[b+1] - q_indptr[b] query tokens, the LAST
// tokens of its cached pages (the engine writes the chunk's K/V into its frames first), and query
// token i of a chunk of n sees KV tokens [0, len - n + i] (aligned to the end, as FlashInfer does).
// GQA: query head h reads KV head h / (num_qo_heads / kv_heads), consecutive groups as in Llama.
//
// q and out are f32 on every device: their bytes are tiny next to the KV the kernel streams, and
// one format keeps the launcher surface small. Scores accumulate in f32 with a running-max
// (online) softmax; `lse` returns the natural-log sum of exp(score) per row so that attention
// over separate page sets can be merged exactly.
#pragma once

#include <cstdint>

#include "kernels/paged_kv.hpp"

namespace kvtier::kernels {

struct AttentionParams {
  PagedKv kv;
  ResidencyGuard residency;
  uint32_t num_qo_heads = 0;  // a multiple of kv.kv_heads
  // Prefill only: [batch + 1], q_indptr[0] == 0, chunk lengths <= sequence lengths.
  // Decode: nullptr (row b is sequence b).
  const uint32_t* q_indptr = nullptr;
  const float* q = nullptr;  // [rows][num_qo_heads][head_dim]
  float* out = nullptr;      // [rows][num_qo_heads][head_dim]
  float* lse = nullptr;      // optional [rows][num_qo_heads], natural log
  float sm_scale = 0.0f;     // score = q.k * sm_scale; 0 selects 1/sqrt(head_dim)

  float effective_sm_scale() const;
};

// Query rows of a host-readable parameter set: batch for decode, q_indptr[batch] for prefill.
uint32_t query_rows(const AttentionParams& p);

// Everything a launcher checks before reading a byte (host-readable tables): the KV view
// (validate_paged_kv: table, lengths, fp8 scales of the listed frames), head counts, pointers,
// chunk lengths. Residency is checked separately (check_residency).
Status validate_attention(const AttentionParams& p);

}  // namespace kvtier::kernels
