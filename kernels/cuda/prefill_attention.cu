// Chunked causal prefill attention over paged KV.
//
// Grid (query blocks, batch, kv_heads), 128 threads. A CTA serves blocks of up to 16 query rows
// (query tokens x the GQA group of one KV head), held pre-scaled in shared memory: block x, then
// x + gridDim.x and so on, so a grid sized for fewer tokens than a chunk holds (the caller's
// max_chunk_tokens, a bound it may get wrong) still computes every row. For each block it walks the
// KV tokens those rows may see in tiles: all threads widen a tile of K and V to f32 in shared
// memory (K rows padded by one float so that lane j reading row j hits bank j), then each warp
// updates its rows: lane j scores token j, a warp max/sum gives the online-softmax step, and each
// lane accumulates its head_dim / 32 output dims with the weights broadcast by shuffles.
//
// This is a CUDA-core kernel: correct for every shape the CPU path takes (group <= 16, head_dim
// a power of two in [32, 256]), not a tensor-core FlashAttention. Instantiations: 3 dtypes.
//
// NaN propagates as on the CPU (no step is skipped on its max; masked lanes never enter the sums).
// The device tables are trusted only as far as memory safety needs: a sequence whose KV entry is
// malformed (device_common.cuh) or whose chunk is longer than it gets NaN in its rows, and a
// q_indptr that does not bound the sequence's rows inside [0, q_indptr[batch]) gets nothing
// written. Launchers reject both on the host where they have host copies of the tables.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch_args.hpp"

namespace kvtier::kernels::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;
constexpr int kRowsPerWarp = kMaxRows / kWarps;
constexpr int kMaxDimsPerLane = 8;  // head_dim 256 / 32 lanes
constexpr float kLn2 = 0.69314718055994531f;

__host__ __device__ constexpr uint32_t tile_tokens(uint32_t dim) { return dim <= 128 ? 32 : 8; }

// One block of query rows (tokens tok0 .. of sequence b, KV head kvh): see the file comment.
// Requires chunk <= len (the caller checks), so no visible end below underflows.
template <KvType T>
__device__ __forceinline__ void prefill_block(const AttentionArgs& a, uint32_t b, uint32_t kvh,
                                              uint32_t chunk, uint32_t len, uint32_t tok0,
                                              uint32_t tokens_per_block, float* smem) {
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  const uint32_t dim = a.kv.head_dim;
  const uint32_t group = a.group;
  const uint32_t ntok = min(tokens_per_block, chunk - tok0);
  const uint32_t rows = ntok * group;
  const uint32_t first_visible_end = len - chunk + tok0 + 1;  // of the block's first token
  const uint32_t kv_hi = first_visible_end + ntok - 1;
  const uint32_t kt = tile_tokens(dim);
  const uint64_t v_offset = static_cast<uint64_t>(a.kv.page_tokens) * a.kv.kv_heads * dim * kEs;

  float* q_s = smem;                  // [kMaxRows][dim]
  float* k_s = q_s + kMaxRows * dim;  // [kt][dim + 1]
  float* v_s = k_s + kt * (dim + 1);  // [kt][dim]

  for (uint32_t idx = threadIdx.x; idx < rows * dim; idx += kThreads) {
    const uint32_t r = idx / dim, d = idx % dim;
    const uint64_t row = static_cast<uint64_t>(a.q_indptr[b] + tok0 + r / group) * a.num_qo_heads +
                         kvh * group + r % group;
    q_s[idx] = a.q[row * dim + d] * a.q_scale;
  }

  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t dims_per_lane = dim / 32;
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) o[rr][i] = 0.0f;
  }

  for (uint32_t t0 = 0; t0 < kv_hi; t0 += kt) {
    const uint32_t tile = min(kt, kv_hi - t0);
    __syncthreads();  // previous tile fully consumed (and q_s written, on the first pass)
    for (uint32_t idx = threadIdx.x; idx < tile * (dim / 8); idx += kThreads) {
      const uint32_t j = idx / (dim / 8), c = idx % (dim / 8);
      uint32_t frame;
      const uint8_t* row = kv_row(a.kv, b, t0 + j, kvh, kEs, &frame) + c * 8 * kEs;
      float kf[8], vf[8];
      load8<T>(row, frame_scale(a.kv, frame, 0), kf);
      load8<T>(row + v_offset, frame_scale(a.kv, frame, 1), vf);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        k_s[j * (dim + 1) + c * 8 + e] = kf[e];
        v_s[j * dim + c * 8 + e] = vf[e];
      }
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const uint32_t r = warp + rr * kWarps;
      if (r >= rows) break;  // uniform per warp
      const uint32_t end = first_visible_end + r / group;
      if (end <= t0) continue;  // this row sees nothing of the tile (uniform per warp)
      const uint32_t visible = min(tile, end - t0);
      float s = -INFINITY;
      if (lane < visible) {
        float dot = 0.0f;
        const float* qr = q_s + r * dim;
        const float* kr = k_s + lane * (dim + 1);
        for (uint32_t d = 0; d < dim; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot;
      }
      const float mx = fmaxf(m[rr], warp_max(s));
      const float p = lane < visible ? exp2f(s - mx) : 0.0f;
      const float alpha = exp2f(m[rr] - mx);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = mx;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        if (i >= dims_per_lane) break;
        const uint32_t d = lane + 32 * i;
        float acc = o[rr][i] * alpha;
        for (uint32_t j = 0; j < visible; ++j) {
          acc = fmaf(__shfl_sync(0xffffffffu, p, j), v_s[j * dim + d], acc);
        }
        o[rr][i] = acc;
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const uint32_t r = warp + rr * kWarps;
    if (r >= rows) break;
    const uint64_t head = static_cast<uint64_t>(a.q_indptr[b] + tok0 + r / group) * a.num_qo_heads +
                          kvh * group + r % group;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      if (i >= dims_per_lane) break;
      a.out[head * dim + lane + 32 * i] = o[rr][i] * inv;
    }
    if (lane == 0 && a.lse != nullptr) a.lse[head] = (m[rr] + log2f(l[rr])) * kLn2;
  }
}

// NaN into out and lse of one block of query rows whose sequence cannot be computed.
__device__ __forceinline__ void poison_block(const AttentionArgs& a, uint32_t b, uint32_t kvh,
                                             uint32_t chunk, uint32_t tok0,
                                             uint32_t tokens_per_block) {
  const uint32_t dim = a.kv.head_dim;
  const uint32_t group = a.group;
  const uint32_t rows = min(tokens_per_block, chunk - tok0) * group;
  const float nan = __int_as_float(0x7fc00000);
  for (uint32_t idx = threadIdx.x; idx < rows * dim; idx += kThreads) {
    const uint32_t r = idx / dim, d = idx % dim;
    const uint64_t head = static_cast<uint64_t>(a.q_indptr[b] + tok0 + r / group) * a.num_qo_heads +
                          kvh * group + r % group;
    a.out[head * dim + d] = nan;
    if (d == 0 && a.lse != nullptr) a.lse[head] = nan;
  }
}

template <KvType T>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(AttentionArgs a, uint32_t tokens_per_block) {
  extern __shared__ float smem[];
  const uint32_t b = blockIdx.y;
  const uint32_t kvh = blockIdx.z;
  const uint32_t q0 = a.q_indptr[b];
  const uint32_t q1 = a.q_indptr[b + 1];
  // Uniform per CTA, before any barrier: rows outside [0, q_indptr[batch]) cannot be addressed.
  if (q1 < q0 || q1 > a.q_indptr[a.kv.batch]) return;
  const uint32_t chunk = q1 - q0;
  uint32_t len;
  const bool ok = sequence_length(a.kv, b, &len) && chunk <= len;
  // 64-bit steps: gridDim.x * tokens_per_block may reach 2^32 and wrap a uint32 to 0.
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * tokens_per_block;
  for (uint64_t tok0 = static_cast<uint64_t>(blockIdx.x) * tokens_per_block; tok0 < chunk;
       tok0 += step) {
    __syncthreads();  // the previous query block's q_s and tiles fully consumed
    if (ok) {
      prefill_block<T>(a, b, kvh, chunk, len, static_cast<uint32_t>(tok0), tokens_per_block, smem);
    } else {
      poison_block(a, b, kvh, chunk, static_cast<uint32_t>(tok0), tokens_per_block);
    }
  }
}

template <KvType T>
cudaError_t launch(const AttentionArgs& a, uint32_t max_chunk_tokens, cudaStream_t stream) {
  const uint32_t dim = a.kv.head_dim;
  const uint32_t tokens_per_block = kMaxRows / a.group;
  // In 64 bits (max_chunk_tokens + tokens_per_block wraps near 2^32), and within the grid's x
  // limit: CTAs loop over the query blocks a shorter grid leaves out.
  const uint64_t wanted = (uint64_t{max_chunk_tokens} + tokens_per_block - 1) / tokens_per_block;
  const uint32_t blocks =
      static_cast<uint32_t>(std::clamp<uint64_t>(wanted, 1, uint64_t{0x7fffffff}));
  const uint32_t kt = tile_tokens(dim);
  const std::size_t smem = sizeof(float) * (kMaxRows * dim + kt * (dim + 1) + kt * dim);
  const dim3 grid(blocks, a.kv.batch, a.kv.kv_heads);  // batch, kv_heads <= 65535: launcher
  prefill_kernel<T><<<grid, kThreads, smem, stream>>>(a, tokens_per_block);
  return cudaGetLastError();
}

}  // namespace

cudaError_t enqueue_prefill(const AttentionArgs& a, uint32_t max_chunk_tokens,
                            cudaStream_t stream) {
  if (a.kv.batch == 0) return cudaSuccess;
  if (a.group == 0 || a.group > kMaxRows) return cudaErrorInvalidValue;
  switch (a.kv.dtype) {
    case KvType::kF16: return launch<KvType::kF16>(a, max_chunk_tokens, stream);
    case KvType::kBF16: return launch<KvType::kBF16>(a, max_chunk_tokens, stream);
    case KvType::kFP8E4M3: return launch<KvType::kFP8E4M3>(a, max_chunk_tokens, stream);
    case KvType::kF32: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtier::kernels::cuda::detail
