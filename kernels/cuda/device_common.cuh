// Device helpers shared by the CUDA kernel files: widening 8 KV elements to f32, warp reductions,
// paged addressing, and the fp8 page quantization steps of frame_ops.cu and page_codec.cu (one
// copy, so both produce the bytes of the CPU path in kernels/cpu/frame_ops.cpp: the same f32
// operations, correctly rounded, in the same order). Header-only, included by .cu files only.
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

template <KvType T>
__device__ __forceinline__ float load_wide(const uint8_t* p, uint64_t i) {
  if constexpr (T == KvType::kF32) {
    return reinterpret_cast<const float*>(p)[i];
  } else if constexpr (T == KvType::kF16) {
    return __half2float(reinterpret_cast<const __half*>(p)[i]);
  } else {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// Element i of a wide (f32/f16/bf16) buffer = v, rounded to nearest even.
template <KvType T>
__device__ __forceinline__ void store_wide(uint8_t* p, uint64_t i, float v) {
  if constexpr (T == KvType::kF32) {
    reinterpret_cast<float*>(p)[i] = v;
  } else if constexpr (T == KvType::kF16) {
    reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

constexpr float kFp8Max = 448.0f;

// The scale kept with a half page whose finite max |x| is amax (1 for an all-zero half), and the
// factor its elements are multiplied by before rounding to e4m3. As on the CPU
// (kernels/cpu/frame_ops.cpp): when 448 / amax overflows (amax below 448 / FLT_MAX), the half
// encodes as signed zeros (factor 0) with scale 1, rather than x * inf turning zeros into NaN.
__device__ __forceinline__ bool fp8_inverse_overflows(float amax) {
  return amax > 0.0f && isinf(__fdiv_rn(kFp8Max, amax));
}
__device__ __forceinline__ float fp8_scale(float amax) {
  return amax > 0.0f && !fp8_inverse_overflows(amax) ? __fdiv_rn(amax, kFp8Max) : 1.0f;
}
__device__ __forceinline__ float fp8_inverse_scale(float amax) {
  if (fp8_inverse_overflows(amax)) return 0.0f;
  return amax > 0.0f ? __fdiv_rn(kFp8Max, amax) : 1.0f;
}
// The scale of a half holding NaN or inf (its bytes are zeros): the CPU path's quiet NaN.
__device__ __forceinline__ float fp8_refused_scale() { return __int_as_float(0x7fc00000); }

// e4m3(x * inv), round to nearest even, saturating at +-448.
__device__ __forceinline__ uint8_t encode_fp8(float x, float inv) {
  return __nv_cvt_float_to_fp8(__fmul_rn(x, inv), __NV_SATFINITE, __NV_E4M3);
}
// value(v) * scale; every e4m3 value is exact in f16.
__device__ __forceinline__ float decode_fp8(uint8_t v, float scale) {
  return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3))), scale);
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

// Max |x| over a CTA of kThreads threads (every thread calls it with its partial max). fmaxf
// drops NaN: callers track non-finite elements separately.
template <int kThreads>
__device__ __forceinline__ float block_abs_max(float v) {
  __shared__ float partial[kThreads / 32];
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) r = fmaxf(r, partial[w]);
  __syncthreads();
  return r;
}

// Tokens of sequence b in *len; false (and 0) when its entry of the device table is malformed: no
// pages, last_page_len outside [1, page_tokens], or more than kMaxSequenceTokens tokens (counted
// in 64 bits: the uint32 sum wraps). Launchers validate host copies where they have them; this
// keeps a kernel given a bad device table inside the sequence's pages anyway (callers write NaN).
__device__ __forceinline__ bool sequence_length(const PagedArgs& kv, uint32_t b, uint32_t* len) {
  const uint32_t first = kv.indptr[b];
  const uint32_t end = kv.indptr[b + 1];
  const uint32_t last = kv.last_page_len[b];
  *len = 0;
  if (end <= first || last == 0 || last > kv.page_tokens) return false;
  const uint64_t tokens = static_cast<uint64_t>(end - first - 1) * kv.page_tokens + last;
  if (tokens > kMaxSequenceTokens) return false;
  *len = static_cast<uint32_t>(tokens);
  return true;
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
