// CUDA launchers of paged attention: split-K decode and chunked causal prefill
// (contract and layouts in kernels/attention_params.hpp; kernels in decode_attention.cu and
// prefill_attention.cu). Includable from plain C++; declared only in CUDA builds.
//
// All pointers in the parameters are device pointers (the tables included), except the
// residency guard's host_* copies. Launchers check what the host can see (shapes, the page and
// arena sizes, 4-byte alignment of every f32/u32 array, the grid limits (batch and kv_heads up
// to 65535), the stream, the workspace, and, when residency checking is enabled, the host copies
// of the tables: validated as the CPU path validates its own, every listed frame resident) and
// then only enqueue: they never synchronize, and never use the legacy default stream (a null
// stream is rejected). A rejected launch returns cudaErrorInvalidValue without enqueuing
// anything; last_launch_error() then says why (naming the frame for a residency failure), and
// the same line is logged. Without host copies the device tables are trusted: validate them
// where they are built (validate_attention). The kernels still stay inside each sequence's pages:
// a malformed sequence (no pages, last_page_len outside [1, page_tokens], a chunk longer than its
// sequence) gets NaN outputs and lse; frame ids and the fp8 scales are not checked on the device.
//
// Supported here: KV f16, bf16, fp8_e4m3 (with per-frame scales); head_dim 32, 64, 128 or 256;
// query heads per KV head up to 8 (decode) or 16 (prefill). The CPU path takes every shape.
#pragma once

#if defined(KVTIER_HAVE_CUDA)

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention_params.hpp"

namespace kvtier::kernels::cuda {

// KV splits for decode: enough CTAs (batch x kv_heads x splits) to fill every SM twice, without
// cutting a sequence below 256 tokens per split; 1 when the batch alone fills the device.
uint32_t choose_decode_splits(uint32_t batch, uint32_t kv_heads, int multiprocessors,
                              uint32_t max_seq_len);

// Bytes of workspace launch_decode_attention needs for `splits` (0 when splits == 1).
std::size_t decode_workspace_bytes(uint32_t batch, uint32_t num_qo_heads, uint32_t head_dim,
                                   uint32_t splits);

// Decode (p.q_indptr == nullptr). `workspace`: device memory of decode_workspace_bytes().
cudaError_t launch_decode_attention(const AttentionParams& p, uint32_t splits, void* workspace,
                                    std::size_t workspace_bytes, cudaStream_t stream);

// Chunked prefill (p.q_indptr on the device). `max_chunk_tokens` sizes the grid: one wave of CTAs
// covers that many query tokens per sequence. A longer chunk is still computed whole (each CTA
// then takes several query blocks), with less parallelism; 0 is taken as 1.
cudaError_t launch_prefill_attention(const AttentionParams& p, uint32_t max_chunk_tokens,
                                     cudaStream_t stream);

// Why the last launcher call on this thread was rejected; empty after an accepted one.
const std::string& last_launch_error();

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_HAVE_CUDA
