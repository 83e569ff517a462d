// Internal: the plain argument blocks the public CUDA launchers (attention_cuda.cpp,
// frame_ops_cuda.cpp) hand to the kernel files (*.cu), and the enqueue functions those define.
//
// The split keeps host-side work (validation, residency, logging, Status) in ordinary C++ and the
// .cu files down to kernels plus a launch each, so nvcc compiles little besides device code.
// Everything here is passed by value to the kernels; pointers are device (or mapped) pointers.
// Enqueue functions only launch: they return the launch's cudaError_t and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels::cuda::detail {

// KV dtype codes as kernels/types.hpp's Dtype (kept numeric so this header needs nothing else).
enum class KvType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFP8E4M3 = 3 };

// kernels::kMaxSequenceTokens (kernels/paged_kv.hpp; attention_cuda.cpp asserts they agree).
inline constexpr uint32_t kMaxSequenceTokens = uint32_t{1} << 31;

struct PagedArgs {
  const uint8_t* arena;
  uint64_t frame_stride;
  const float* scales;  // fp8 only, [num_frames][2]; nullptr = 1.0
  const uint32_t* indptr;
  const uint32_t* indices;
  const uint32_t* last_page_len;
  uint32_t batch;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t page_tokens;
  KvType dtype;
};

struct AttentionArgs {
  PagedArgs kv;
  const uint32_t* q_indptr;  // prefill only
  const float* q;
  float* out;
  float* lse;  // may be null
  uint32_t num_qo_heads;
  uint32_t group;
  float q_scale;  // sm_scale * log2(e)
};

// Decode: splits along the KV axis; with splits > 1, part_ml [batch][heads][splits][2] and
// part_o [batch][heads][splits][head_dim] receive unnormalised partial states and a second kernel
// merges them.
cudaError_t enqueue_decode(const AttentionArgs& a, uint32_t splits, float* part_ml, float* part_o,
                           cudaStream_t stream);

// Prefill: one wave of the grid covers max_chunk_tokens query tokens of every sequence; CTAs loop
// over the rest.
cudaError_t enqueue_prefill(const AttentionArgs& a, uint32_t max_chunk_tokens, cudaStream_t stream);

struct CopyArgs {
  uint8_t* arena;
  uint64_t frame_stride;
  uint64_t frame_bytes;
  const uint32_t* frames;
  uint32_t count;
  uint8_t* staging;
};
cudaError_t enqueue_frame_copy(const CopyArgs& a, bool to_staging, cudaStream_t stream);

struct Fp8Args {
  uint8_t* arena;
  uint64_t frame_stride;
  KvType dtype;  // f32, f16 or bf16
  uint64_t half_elems;
  const uint32_t* frames;
  uint32_t count;
  uint8_t* staging;
  float* scales;
};
cudaError_t enqueue_quantize_fp8(const Fp8Args& a, cudaStream_t stream);
cudaError_t enqueue_dequantize_fp8(const Fp8Args& a, cudaStream_t stream);

}  // namespace kvtier::kernels::cuda::detail
