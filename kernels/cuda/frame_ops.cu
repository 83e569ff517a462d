// Copies between paged frames and packed staging buffers, plain and through fp8 e4m3.
//
// Copies: grid (count, up to 8 slices per frame), 256 threads, 16-byte vectors when every
// address and size allows it (frames and pages are multiples of 512 bytes in practice), bytes
// otherwise. fp8: one CTA per (frame, half page): a block-wide amax, then the scaled conversion
// with the same f32 operations as the CPU path (x * (448 / amax), round to nearest even,
// saturating), so both produce identical bytes. Instantiations: copy 1, quantize 3, dequantize 3.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch_args.hpp"

namespace kvtier::kernels::cuda::detail {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kQuantThreads = 256;

__global__ void copy_kernel(CopyArgs a, bool to_staging, bool vectorized) {
  const uint32_t i = blockIdx.x;
  uint8_t* frame = a.arena + static_cast<uint64_t>(__ldg(a.frames + i)) * a.frame_stride;
  uint8_t* slot = a.staging + static_cast<uint64_t>(i) * a.frame_bytes;
  uint8_t* dst = to_staging ? slot : frame;
  const uint8_t* src = to_staging ? frame : slot;
  const uint64_t stride = static_cast<uint64_t>(gridDim.y) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (vectorized) {
    const uint64_t n = a.frame_bytes / 16;
    for (uint64_t k = first; k < n; k += stride) {
      reinterpret_cast<uint4*>(dst)[k] = reinterpret_cast<const uint4*>(src)[k];
    }
  } else {
    for (uint64_t k = first; k < a.frame_bytes; k += stride) dst[k] = src[k];
  }
}

template <KvType T>
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(Fp8Args a) {
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  const uint32_t i = blockIdx.x;
  const uint32_t half = blockIdx.y;
  const uint8_t* src = a.arena + static_cast<uint64_t>(__ldg(a.frames + i)) * a.frame_stride +
                       half * a.half_elems * kEs;
  uint8_t* dst = a.staging + (2 * static_cast<uint64_t>(i) + half) * a.half_elems;
  float amax = 0.0f;
  int bad = 0;
  for (uint64_t k = threadIdx.x; k < a.half_elems; k += kQuantThreads) {
    const float x = fabsf(load_wide<T>(src, k));
    bad |= !isfinite(x);
    amax = fmaxf(amax, x);
  }
  bad = __syncthreads_or(bad);
  amax = block_abs_max<kQuantThreads>(amax);
  if (bad) {
    for (uint64_t k = threadIdx.x; k < a.half_elems; k += kQuantThreads) dst[k] = 0;
    if (threadIdx.x == 0) a.scales[2 * i + half] = fp8_refused_scale();
    return;
  }
  const float inv = fp8_inverse_scale(amax);
  if (threadIdx.x == 0) a.scales[2 * i + half] = fp8_scale(amax);
  for (uint64_t k = threadIdx.x; k < a.half_elems; k += kQuantThreads) {
    dst[k] = encode_fp8(load_wide<T>(src, k), inv);
  }
}

template <KvType T>
__global__ void __launch_bounds__(kQuantThreads) dequantize_kernel(Fp8Args a) {
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  const uint32_t i = blockIdx.x;
  const uint32_t half = blockIdx.y;
  uint8_t* dst = a.arena + static_cast<uint64_t>(__ldg(a.frames + i)) * a.frame_stride +
                 half * a.half_elems * kEs;
  const uint8_t* src = a.staging + (2 * static_cast<uint64_t>(i) + half) * a.half_elems;
  const float scale = a.scales[2 * i + half];
  for (uint64_t k = threadIdx.x; k < a.half_elems; k += kQuantThreads) {
    store_wide<T>(dst, k, decode_fp8(src[k], scale));
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t enqueue_frame_copy(const CopyArgs& a, bool to_staging, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  const bool vectorized = aligned16(a.arena) && aligned16(a.staging) && a.frame_stride % 16 == 0 &&
                          a.frame_bytes % 16 == 0;
  const uint64_t per_block = static_cast<uint64_t>(kCopyThreads) * (vectorized ? 16 : 1) * 4;
  const uint32_t slices =
      static_cast<uint32_t>(std::min<uint64_t>(8, (a.frame_bytes + per_block - 1) / per_block));
  copy_kernel<<<dim3(a.count, slices > 0 ? slices : 1), kCopyThreads, 0, stream>>>(a, to_staging,
                                                                                   vectorized);
  return cudaGetLastError();
}

cudaError_t enqueue_quantize_fp8(const Fp8Args& a, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  const dim3 grid(a.count, 2);
  switch (a.dtype) {
    case KvType::kF32: quantize_kernel<KvType::kF32><<<grid, kQuantThreads, 0, stream>>>(a); break;
    case KvType::kF16: quantize_kernel<KvType::kF16><<<grid, kQuantThreads, 0, stream>>>(a); break;
    case KvType::kBF16:
      quantize_kernel<KvType::kBF16><<<grid, kQuantThreads, 0, stream>>>(a);
      break;
    case KvType::kFP8E4M3: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t enqueue_dequantize_fp8(const Fp8Args& a, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  const dim3 grid(a.count, 2);
  switch (a.dtype) {
    case KvType::kF32:
      dequantize_kernel<KvType::kF32><<<grid, kQuantThreads, 0, stream>>>(a);
      break;
    case KvType::kF16:
      dequantize_kernel<KvType::kF16><<<grid, kQuantThreads, 0, stream>>>(a);
      break;
    case KvType::kBF16:
      dequantize_kernel<KvType::kBF16><<<grid, kQuantThreads, 0, stream>>>(a);
      break;
    case KvType::kFP8E4M3: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda::detail
