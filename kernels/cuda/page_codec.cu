// fp8 page codec kernels and their launchers (contract in kernels/cuda/page_codec_cuda.hpp).
//
// Encode: one CTA per (page, half). Pass 1 folds the half's max |x| (a block reduction), pass 2
// re-reads the half (16-64 KiB, from L2 when it lives in HBM) and writes e4m3 bytes; thread 0
// writes the half's scale into the trailer. Decode needs no reduction, so each half is split over
// up to kMaxDecodeSlices CTAs to keep more reads of mapped host memory in flight. Both take the
// conversion steps from device_common.cuh (shared with frame_ops.cu), so the bytes are the CPU's.
//
// Access width: when both pages of an entry are 16-byte aligned and half_elems is a multiple of
// 16 (always, for frames and head_dim % 16 == 0), a thread moves 16 elements per step: one 16-byte
// access on the fp8 side (a warp covers 512 contiguous bytes, which is what crosses PCIe when
// that side is mapped host memory) and 16-byte accesses on the wide side. Otherwise element by
// element. The choice is per entry and uniform within a CTA.
//
// The batch is a __grid_constant__ parameter: indexing its pointer arrays by blockIdx reads the
// parameter bank directly instead of copying the 2 KiB struct to local memory. Rejected: keeping
// the half in shared memory between the passes (64 KiB for f32 halves caps residency at three
// CTAs per SM, and the re-read hits L2 anyway). Instantiations: encode 3, decode 3.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/device_common.cuh"
// nvcc's front end (not the host compiler) reports assignments of [[nodiscard]] Status in
// status.hpp as ignored results (diagnostic 2810); the host compiler checks those headers.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 2810
#include "kernels/cuda/page_codec_cuda.hpp"
#include "kernels/page_codec.hpp"
#include "kvtier/log.hpp"
#pragma nv_diagnostic pop

namespace kvtier::kernels::cuda {
namespace {

using detail::KvBytes;
using detail::KvType;

constexpr int kCodecThreads = 256;
constexpr uint32_t kVecElems = 16;  // per thread step of the wide path: 16 fp8 bytes
constexpr uint64_t kVecStep = static_cast<uint64_t>(kCodecThreads) * kVecElems;
constexpr uint32_t kMaxDecodeSlices = 8;

union Bytes16 {
  uint4 vec;
  uint8_t bytes[16];
};

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

__device__ __forceinline__ bool wide_path(const void* a, const void* b, uint64_t half_elems) {
  return half_elems % kVecElems == 0 && aligned16(a) && aligned16(b);
}

// The trailer is 4-byte aligned whenever the fp8 page is and half_elems is even; the batch does
// not promise either, so fall back to bytes (little-endian, as the CPU writes the float).
__device__ __forceinline__ void store_scale(uint8_t* p, float v) {
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    *reinterpret_cast<float*>(p) = v;
    return;
  }
  const uint32_t bits = __float_as_uint(v);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(bits >> (8 * i));
}

__device__ __forceinline__ float load_scale(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const float*>(p);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) bits |= static_cast<uint32_t>(p[i]) << (8 * i);
  return __uint_as_float(bits);
}

// 16 wide elements at p (16-byte aligned), widened exactly.
template <KvType T>
__device__ __forceinline__ void load16_wide(const uint8_t* p, float (&lo)[8], float (&hi)[8]) {
  detail::load8<T>(p, 1.0f, lo);
  detail::load8<T>(p + 8 * KvBytes<T>::kValue, 1.0f, hi);
}

// 8 elements to p (16-byte aligned), each rounded by store_wide.
template <KvType T>
__device__ __forceinline__ void store8_wide(uint8_t* p, const float (&v)[8]) {
  if constexpr (T == KvType::kF32) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    Bytes16 out;
#pragma unroll
    for (int i = 0; i < 8; ++i) detail::store_wide<T>(out.bytes, i, v[i]);
    *reinterpret_cast<uint4*>(p) = out.vec;
  }
}

template <KvType T>
__global__ void __launch_bounds__(kCodecThreads)
    encode_pages_kernel(const __grid_constant__ PageCodecBatch b) {
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  const uint32_t half = blockIdx.y;
  const uint64_t n = b.half_elems;
  const void* page_in = b.src[blockIdx.x];
  uint8_t* page_out = static_cast<uint8_t*>(b.dst[blockIdx.x]);
  const uint8_t* src = static_cast<const uint8_t*>(page_in) + half * n * kEs;
  uint8_t* dst = page_out + half * n;
  const bool vec = wide_path(page_in, page_out, n);

  float amax = 0.0f;
  int bad = 0;
  auto fold = [&](float v) {
    const float x = fabsf(v);
    bad |= !isfinite(x);
    amax = fmaxf(amax, x);
  };
  if (vec) {
    for (uint64_t k = threadIdx.x * kVecElems; k < n; k += kVecStep) {
      float lo[8], hi[8];
      load16_wide<T>(src + k * kEs, lo, hi);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        fold(lo[i]);
        fold(hi[i]);
      }
    }
  } else {
    for (uint64_t k = threadIdx.x; k < n; k += kCodecThreads) fold(detail::load_wide<T>(src, k));
  }
  bad = __syncthreads_or(bad);
  amax = detail::block_abs_max<kCodecThreads>(amax);

  uint8_t* scale_at = page_out + 2 * n + half * sizeof(float);
  if (bad) {
    if (vec) {
      for (uint64_t k = threadIdx.x * kVecElems; k < n; k += kVecStep) {
        *reinterpret_cast<uint4*>(dst + k) = make_uint4(0, 0, 0, 0);
      }
    } else {
      for (uint64_t k = threadIdx.x; k < n; k += kCodecThreads) dst[k] = 0;
    }
    if (threadIdx.x == 0) store_scale(scale_at, detail::fp8_refused_scale());
    return;
  }
  const float inv = detail::fp8_inverse_scale(amax);
  if (threadIdx.x == 0) store_scale(scale_at, detail::fp8_scale(amax));
  if (vec) {
    for (uint64_t k = threadIdx.x * kVecElems; k < n; k += kVecStep) {
      float lo[8], hi[8];
      load16_wide<T>(src + k * kEs, lo, hi);
      Bytes16 out;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        out.bytes[i] = detail::encode_fp8(lo[i], inv);
        out.bytes[8 + i] = detail::encode_fp8(hi[i], inv);
      }
      *reinterpret_cast<uint4*>(dst + k) = out.vec;
    }
  } else {
    for (uint64_t k = threadIdx.x; k < n; k += kCodecThreads) {
      dst[k] = detail::encode_fp8(detail::load_wide<T>(src, k), inv);
    }
  }
}

// Grid (count, 2 halves, slices): slice z of a half takes its elements z, z + slices, ... in
// steps of one CTA's width.
template <KvType T>
__global__ void __launch_bounds__(kCodecThreads)
    decode_pages_kernel(const __grid_constant__ PageCodecBatch b) {
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  const uint32_t half = blockIdx.y;
  const uint64_t n = b.half_elems;
  const uint8_t* page_in = static_cast<const uint8_t*>(b.src[blockIdx.x]);
  void* page_out = b.dst[blockIdx.x];
  const uint8_t* src = page_in + half * n;
  uint8_t* dst = static_cast<uint8_t*>(page_out) + half * n * kEs;
  const float scale = load_scale(page_in + 2 * n + half * sizeof(float));
  const uint64_t first = static_cast<uint64_t>(blockIdx.z) * kCodecThreads + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.z) * kCodecThreads;
  if (wide_path(page_in, page_out, n)) {
    for (uint64_t k = first * kVecElems; k < n; k += stride * kVecElems) {
      Bytes16 in;
      in.vec = *reinterpret_cast<const uint4*>(src + k);
      float lo[8], hi[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        lo[i] = detail::decode_fp8(in.bytes[i], scale);
        hi[i] = detail::decode_fp8(in.bytes[8 + i], scale);
      }
      store8_wide<T>(dst + k * kEs, lo);
      store8_wide<T>(dst + (k + 8) * kEs, hi);
    }
  } else {
    for (uint64_t k = first; k < n; k += stride) {
      detail::store_wide<T>(dst, k, detail::decode_fp8(src[k], scale));
    }
  }
}

cudaError_t reject(const char* what, const Status& st) {
  log(LogLevel::kError, std::string(what) + " launch rejected: " + st.to_string());
  return cudaErrorInvalidValue;
}

Status check_launch(const PageCodecBatch& b, PageCodecOp op, cudaStream_t stream) {
  if (stream == nullptr) return invalid_argument("null (legacy default) stream");
  return validate_page_codec_batch(b, op);
}

}  // namespace

cudaError_t launch_encode_pages_fp8(const PageCodecBatch& b, cudaStream_t stream) {
  if (Status st = check_launch(b, PageCodecOp::kEncode, stream); !st.ok()) {
    return reject("fp8 page encode", st);
  }
  if (b.count == 0) return cudaSuccess;
  const dim3 grid(b.count, 2);
  switch (b.wide) {
    case Dtype::kF32:
      encode_pages_kernel<KvType::kF32><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kF16:
      encode_pages_kernel<KvType::kF16><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kBF16:
      encode_pages_kernel<KvType::kBF16><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kFP8E4M3: return cudaErrorInvalidValue;  // refused by the validation above
  }
  return cudaGetLastError();
}

cudaError_t launch_decode_pages_fp8(const PageCodecBatch& b, cudaStream_t stream) {
  if (Status st = check_launch(b, PageCodecOp::kDecode, stream); !st.ok()) {
    return reject("fp8 page decode", st);
  }
  if (b.count == 0) return cudaSuccess;
  const uint64_t per_slice = kVecStep;
  const auto slices = static_cast<uint32_t>(
      std::min<uint64_t>(kMaxDecodeSlices, (b.half_elems + per_slice - 1) / per_slice));
  const dim3 grid(b.count, 2, std::max<uint32_t>(1, slices));
  switch (b.wide) {
    case Dtype::kF32:
      decode_pages_kernel<KvType::kF32><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kF16:
      decode_pages_kernel<KvType::kF16><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kBF16:
      decode_pages_kernel<KvType::kBF16><<<grid, kCodecThreads, 0, stream>>>(b);
      break;
    case Dtype::kFP8E4M3: return cudaErrorInvalidValue;  // refused by the validation above
  }
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda
