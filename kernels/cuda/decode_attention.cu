// Split-K ("flash-decoding") paged decode attention.
//
// Grid (splits, kv_heads, batch), 128 threads. A CTA owns one KV head of one sequence and one
// contiguous slice of its tokens, and serves all GROUP query heads of that KV head, so each K/V
// byte is read once per step whatever the GQA ratio. head_dim / 8 lanes share a token (8 elements
// per lane: one 16-byte load for f16/bf16, 8 bytes for fp8), so a warp covers 32 / (head_dim / 8)
// tokens at a time; every such lane group keeps its own online-softmax state over a strided token
// stream, U tokens per step (all their loads issued before any math, to keep several requests in
// flight), and the CTA merges the streams through shared memory at the end. With splits > 1 the
// CTA writes an unnormalised partial state and merge_splits combines them.
//
// Instantiations: 3 dtypes x GROUP_MAX {1, 2, 4, 8}; any group size up to 8 runs in the smallest
// GROUP_MAX that holds it.
//
// NaN propagates as on the CPU: a step is skipped only when none of its tokens is valid (fmaxf
// drops NaN, so a running max that stays -inf does not mean "nothing seen"), and the merges skip
// only states that saw no token (l == 0; l >= 1 once a token was seen, NaN once a score was).
// As on the CPU, a first step whose every score is -inf makes the row NaN (0/0 weights). A
// sequence whose device table entry is malformed (device_common.cuh) gets NaN outputs and lse.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch_args.hpp"

namespace kvtier::kernels::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr float kLn2 = 0.69314718055994531f;

template <KvType T, int GMAX>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(AttentionArgs a, uint32_t splits, float* part_ml, float* part_o) {
  constexpr int U = GMAX >= 8 ? 2 : 4;
  constexpr uint32_t kEs = KvBytes<T>::kValue;
  extern __shared__ float smem[];

  const uint32_t split = blockIdx.x;
  const uint32_t kvh = blockIdx.y;
  const uint32_t b = blockIdx.z;
  const uint32_t dim = a.kv.head_dim;
  const uint32_t group = a.group;
  const uint32_t lanes_per_token = dim / 8;
  const uint32_t groups_per_warp = 32 / lanes_per_token;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t sub = lane / lanes_per_token;
  const uint32_t lane_in = lane % lanes_per_token;
  const uint32_t streams = kWarps * groups_per_warp;
  const uint32_t stream = warp * groups_per_warp + sub;

  uint32_t len;
  const bool table_ok = sequence_length(a.kv, b, &len);  // len 0 when not: nothing is read
  const uint32_t per_split = (len + splits - 1) / splits;
  const uint32_t begin = split * per_split;
  const uint32_t end = min(len, begin + per_split);
  const uint64_t v_offset = static_cast<uint64_t>(a.kv.page_tokens) * a.kv.kv_heads * dim * kEs;

  float q[GMAX][8];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g < group) {
      const float* src =
          a.q + (static_cast<uint64_t>(b) * a.num_qo_heads + kvh * group + g) * dim + lane_in * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = src[i] * a.q_scale;
    }
  }
  float m[GMAX], l[GMAX], acc[GMAX][8];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  // The loop bound is uniform per warp (its first stream), so the shuffles below see every lane.
  for (uint32_t base = begin; base + warp * groups_per_warp < end; base += streams * U) {
    float kf[U][8], vf[U][8];
    bool valid[U];
    bool any_valid = false;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t pos = base + u * streams + stream;
      valid[u] = pos < end;
      any_valid |= valid[u];
      if (valid[u]) {
        uint32_t frame;
        const uint8_t* row = kv_row(a.kv, b, pos, kvh, kEs, &frame) + lane_in * 8 * kEs;
        load8<T>(row, frame_scale(a.kv, frame, 0), kf[u]);
        load8<T>(row + v_offset, frame_scale(a.kv, frame, 1), vf[u]);
      }
    }
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      if (g >= group) continue;
      float s[U];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float dot = 0.0f;
        if (valid[u]) {
#pragma unroll
          for (int i = 0; i < 8; ++i) dot = fmaf(q[g][i], kf[u][i], dot);
        }
        for (uint32_t off = lanes_per_token / 2; off > 0; off >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, off);
        }
        s[u] = valid[u] ? dot : -INFINITY;
        mx = fmaxf(mx, s[u]);
      }
      // No valid token in this step for this lane group (after the shuffles, which every lane
      // must join). Not `mx == -INFINITY`: that also holds when every valid score is NaN.
      if (!any_valid) continue;
      const float alpha = exp2f(m[g] - mx);
      float p[U];
      float psum = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        p[u] = valid[u] ? exp2f(s[u] - mx) : 0.0f;
        psum += p[u];
      }
      l[g] = l[g] * alpha + psum;
      m[g] = mx;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float o = acc[g][i] * alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (valid[u]) o = fmaf(p[u], vf[u][i], o);
        }
        acc[g][i] = o;
      }
    }
  }

  // Merge the token streams: shared [stream][g] (m, l) and [stream][g][dim] acc.
  float* s_ml = smem;
  float* s_o = smem + 2 * streams * GMAX;
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g >= group) continue;
    if (lane_in == 0) {
      s_ml[2 * (stream * GMAX + g)] = m[g];
      s_ml[2 * (stream * GMAX + g) + 1] = l[g];
    }
    float* dst = s_o + (static_cast<uint64_t>(stream) * GMAX + g) * dim + lane_in * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = acc[g][i];
  }
  __syncthreads();

  for (uint32_t idx = threadIdx.x; idx < group * dim; idx += kThreads) {
    const uint32_t g = idx / dim;
    const uint32_t d = idx % dim;
    float mm = -INFINITY;
    for (uint32_t s = 0; s < streams; ++s) mm = fmaxf(mm, s_ml[2 * (s * GMAX + g)]);
    float ll = 0.0f, oo = 0.0f;
    for (uint32_t s = 0; s < streams; ++s) {
      const float ls = s_ml[2 * (s * GMAX + g) + 1];
      if (ls == 0.0f) continue;  // this stream saw no token (a NaN one still counts)
      const float w = exp2f(s_ml[2 * (s * GMAX + g)] - mm);
      ll += ls * w;
      oo += s_o[(static_cast<uint64_t>(s) * GMAX + g) * dim + d] * w;
    }
    if (!table_ok) mm = ll = oo = __int_as_float(0x7fc00000);
    const uint64_t head = static_cast<uint64_t>(b) * a.num_qo_heads + kvh * group + g;
    if (splits == 1) {
      a.out[head * dim + d] = oo / ll;
      if (d == 0 && a.lse != nullptr) a.lse[head] = (mm + log2f(ll)) * kLn2;
    } else {
      part_o[(head * splits + split) * dim + d] = oo;
      if (d == 0) {
        part_ml[2 * (head * splits + split)] = mm;
        part_ml[2 * (head * splits + split) + 1] = ll;
      }
    }
  }
}

// One CTA per (sequence, query head), one thread per dim: exact merge of the splits.
__global__ void merge_splits(AttentionArgs a, uint32_t splits, const float* part_ml,
                             const float* part_o) {
  const uint64_t head = blockIdx.x;
  const uint32_t d = threadIdx.x;
  const uint32_t dim = a.kv.head_dim;
  float mm = -INFINITY;
  for (uint32_t s = 0; s < splits; ++s) mm = fmaxf(mm, part_ml[2 * (head * splits + s)]);
  float ll = 0.0f, oo = 0.0f;
  for (uint32_t s = 0; s < splits; ++s) {
    const float ls = part_ml[2 * (head * splits + s) + 1];
    if (ls == 0.0f) continue;  // this split saw no token (a NaN state still counts)
    const float w = exp2f(part_ml[2 * (head * splits + s)] - mm);
    ll += ls * w;
    oo += part_o[(head * splits + s) * dim + d] * w;
  }
  a.out[head * dim + d] = oo / ll;
  if (d == 0 && a.lse != nullptr) a.lse[head] = (mm + log2f(ll)) * kLn2;
}

template <KvType T, int GMAX>
cudaError_t launch(const AttentionArgs& a, uint32_t splits, float* part_ml, float* part_o,
                   cudaStream_t stream) {
  const uint32_t streams = kWarps * (32 / (a.kv.head_dim / 8));
  const std::size_t smem = sizeof(float) * (2 * streams * GMAX + static_cast<std::size_t>(streams) *
                                                                     GMAX * a.kv.head_dim);
  const dim3 grid(splits, a.kv.kv_heads, a.kv.batch);  // kv_heads, batch <= 65535: launcher
  decode_kernel<T, GMAX><<<grid, kThreads, smem, stream>>>(a, splits, part_ml, part_o);
  return cudaGetLastError();
}

template <KvType T>
cudaError_t launch_for_group(const AttentionArgs& a, uint32_t splits, float* part_ml, float* part_o,
                             cudaStream_t stream) {
  if (a.group <= 1) return launch<T, 1>(a, splits, part_ml, part_o, stream);
  if (a.group <= 2) return launch<T, 2>(a, splits, part_ml, part_o, stream);
  if (a.group <= 4) return launch<T, 4>(a, splits, part_ml, part_o, stream);
  if (a.group <= 8) return launch<T, 8>(a, splits, part_ml, part_o, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t enqueue_decode(const AttentionArgs& a, uint32_t splits, float* part_ml, float* part_o,
                           cudaStream_t stream) {
  if (a.kv.batch == 0) return cudaSuccess;
  cudaError_t err = cudaErrorInvalidValue;
  switch (a.kv.dtype) {
    case KvType::kF16:
      err = launch_for_group<KvType::kF16>(a, splits, part_ml, part_o, stream);
      break;
    case KvType::kBF16:
      err = launch_for_group<KvType::kBF16>(a, splits, part_ml, part_o, stream);
      break;
    case KvType::kFP8E4M3:
      err = launch_for_group<KvType::kFP8E4M3>(a, splits, part_ml, part_o, stream);
      break;
    case KvType::kF32: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || splits == 1) return err;
  // batch x heads <= 2^31 - 1 (the grid's x limit): checked by the launcher.
  merge_splits<<<a.kv.batch * a.num_qo_heads, a.kv.head_dim, 0, stream>>>(a, splits, part_ml,
                                                                          part_o);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda::detail
