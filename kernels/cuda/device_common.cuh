// Device helpers shared by the CUDA kernel files: widening 8 KV elements to f32, warp reductions,
// paged addressing. Header-only, included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_args.hpp"

namespace kvtier::kernels::cuda::detail {

template <KvType T>
struct KvBytes {
  static constexpr uint32_t kValue = T == KvType::kF32 ? 4 : (T == KvType::kFP8E4M3 ? 1 : 2);
};

// out[i] = value(p[i]) * scale for 8 consecutive elements; p is aligned to 8 elements.
template <KvType T>
__device__ __forceinline__ void load8(const uint8_t* p, float scale, float (&out)[8]) {
  if constexpr (T == KvType::kF32) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 16);
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    out[4] = b.x;
    out[5] = b.y;
    out[6] = b.z;
    out[7] = b.w;
  } else if constexpr (T == KvType::kF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else if constexpr (T == KvType::kBF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3));
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  if (T == KvType::kFP8E4M3) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] *= scale;
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ uint32_t sequence_length(const PagedArgs& kv, uint32_t b) {
  const uint32_t pages = kv.indptr[b + 1] - kv.indptr[b];
  return pages == 0 ? 0 : (pages - 1) * kv.page_tokens + kv.last_page_len[b];
}

// Address of K (part 0) or V (part 1) of token `pos` of sequence b, KV head h, first element;
// also the frame, for its fp8 scale.
__device__ __forceinline__ const uint8_t* kv_row(const PagedArgs& kv, uint32_t b, uint32_t pos,
                                                 uint32_t h, uint32_t elem_bytes, uint32_t* frame) {
  const uint32_t page = pos / kv.page_tokens;
  const uint32_t f = __ldg(kv.indices + kv.indptr[b] + page);
  *frame = f;
  const uint64_t token_bytes = static_cast<uint64_t>(kv.kv_heads) * kv.head_dim * elem_bytes;
  return kv.arena + f * kv.frame_stride + (pos - page * kv.page_tokens) * token_bytes +
         static_cast<uint64_t>(h) * kv.head_dim * elem_bytes;
}

__device__ __forceinline__ float frame_scale(const PagedArgs& kv, uint32_t frame, int part) {
  return kv.scales != nullptr ? __ldg(kv.scales + 2 * static_cast<uint64_t>(frame) + part) : 1.0f;
}

}  // namespace kvtier::kernels::cuda::detail
