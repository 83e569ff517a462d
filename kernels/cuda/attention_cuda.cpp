#include "kernels/cuda/attention_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/launch_args.hpp"
#include "kvtier/log.hpp"

namespace kvtier::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr uint32_t kMinSplitTokens = 256;

std::string& last_error() {
  thread_local std::string message;
  return message;
}

cudaError_t reject(const Status& st) {
  last_error() = st.to_string();
  log(LogLevel::kError, "CUDA attention launch rejected: " + last_error());
  return cudaErrorInvalidValue;
}

// The residency guard's host copy of the block table, then every frame it lists: the table
// must be whole (validate_block_table), since the frames checked are the frames the kernel reads.
Status check_host_table(const ResidencyGuard& guard, const PagedKv& kv) {
  if (guard.host_indptr == nullptr || guard.host_indices == nullptr) {
    return invalid_argument(
        "attention launch: residency checking is on but residency.host_indptr or "
        "residency.host_indices is null (the host copies of the block table it checks)");
  }
  KVTIER_RETURN_IF_ERROR(
      validate_block_table(guard.host_indptr, guard.host_indices, kv.batch, kv.num_frames)
          .with_context("attention launch: residency host table"));
  return check_residency(guard, guard.host_indices, guard.host_indptr[kv.batch]);
}

Status check_common(const AttentionParams& p, uint32_t max_group, cudaStream_t stream) {
  if (stream == nullptr) {
    return invalid_argument("attention launch: a null (legacy default) stream; pass a stream");
  }
  KVTIER_RETURN_IF_ERROR(validate_kv_shape(p.kv));
  const uint32_t d = p.kv.head_dim;
  if (d != 32 && d != 64 && d != 128 && d != 256) {
    return invalid_argument("attention launch: head_dim " + std::to_string(d) +
                            " is not 32, 64, 128 or 256 (CUDA kernels)");
  }
  if (p.kv.dtype == Dtype::kF32) {
    return invalid_argument("attention launch: f32 KV has no CUDA kernel; use f16, bf16 or fp8");
  }
  if (reinterpret_cast<uintptr_t>(p.kv.arena) % 16 != 0 || p.kv.frame_stride % 16 != 0) {
    return invalid_argument("attention launch: arena and frame_stride must be 16-byte aligned");
  }
  if (p.num_qo_heads == 0 || p.num_qo_heads % p.kv.kv_heads != 0 ||
      p.num_qo_heads / p.kv.kv_heads > max_group) {
    return invalid_argument("attention launch: " + std::to_string(p.num_qo_heads) +
                            " query heads over " + std::to_string(p.kv.kv_heads) +
                            " KV heads; the group must be a whole number up to " +
                            std::to_string(max_group));
  }
  if (p.kv.batch > 0 && (p.q == nullptr || p.out == nullptr || p.kv.indptr == nullptr ||
                         p.kv.indices == nullptr || p.kv.last_page_len == nullptr)) {
    return invalid_argument("attention launch: q, out or the block table is null");
  }
  if (!std::isfinite(p.sm_scale)) {
    return invalid_argument("attention launch: sm_scale " + std::to_string(p.sm_scale) +
                            " is not finite");
  }
  if (p.residency.enabled && p.residency.check != nullptr && p.kv.batch > 0) {
    KVTIER_RETURN_IF_ERROR(check_host_table(p.residency, p.kv));
  }
  return ok_status();
}

detail::AttentionArgs make_args(const AttentionParams& p) {
  detail::AttentionArgs a{};
  a.kv.arena = p.kv.arena;
  a.kv.frame_stride = p.kv.frame_stride;
  a.kv.scales = p.kv.dtype == Dtype::kFP8E4M3 ? p.kv.scales : nullptr;
  a.kv.indptr = p.kv.indptr;
  a.kv.indices = p.kv.indices;
  a.kv.last_page_len = p.kv.last_page_len;
  a.kv.batch = p.kv.batch;
  a.kv.kv_heads = p.kv.kv_heads;
  a.kv.head_dim = p.kv.head_dim;
  a.kv.page_tokens = p.kv.page_tokens;
  a.kv.dtype = static_cast<detail::KvType>(p.kv.dtype);
  a.q_indptr = p.q_indptr;
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.num_qo_heads = p.num_qo_heads;
  a.group = p.num_qo_heads / p.kv.kv_heads;
  a.q_scale = p.effective_sm_scale() * kLog2e;
  return a;
}

}  // namespace

uint32_t choose_decode_splits(uint32_t batch, uint32_t kv_heads, int multiprocessors,
                              uint32_t max_seq_len) {
  const uint64_t ctas = static_cast<uint64_t>(std::max(1u, batch)) * std::max(1u, kv_heads);
  const uint64_t target = 2 * static_cast<uint64_t>(std::max(1, multiprocessors));
  const uint64_t wanted = (target + ctas - 1) / ctas;
  const uint64_t most = std::max<uint64_t>(1, max_seq_len / kMinSplitTokens);
  return static_cast<uint32_t>(std::clamp<uint64_t>(wanted, 1, std::min<uint64_t>(most, 1024)));
}

std::size_t decode_workspace_bytes(uint32_t batch, uint32_t num_qo_heads, uint32_t head_dim,
                                   uint32_t splits) {
  if (splits <= 1) return 0;
  return sizeof(float) * static_cast<std::size_t>(batch) * num_qo_heads * splits * (head_dim + 2);
}

cudaError_t launch_decode_attention(const AttentionParams& p, uint32_t splits, void* workspace,
                                    std::size_t workspace_bytes, cudaStream_t stream) {
  last_error().clear();
  if (Status st = check_common(p, 8, stream); !st.ok()) return reject(st);
  if (p.q_indptr != nullptr) {
    return reject(
        invalid_argument("decode launch: q_indptr must be null (one query per sequence)"));
  }
  if (splits == 0) return reject(invalid_argument("decode launch: splits must be at least 1"));
  const std::size_t need =
      decode_workspace_bytes(p.kv.batch, p.num_qo_heads, p.kv.head_dim, splits);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return reject(invalid_argument(
        "decode launch: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
        std::to_string(need) + " needed for " + std::to_string(splits) + " splits"));
  }
  float* part_ml = static_cast<float*>(workspace);
  float* part_o = need > 0
                      ? part_ml + 2 * static_cast<std::size_t>(p.kv.batch) * p.num_qo_heads * splits
                      : nullptr;
  return detail::enqueue_decode(make_args(p), splits, part_ml, part_o, stream);
}

cudaError_t launch_prefill_attention(const AttentionParams& p, uint32_t max_chunk_tokens,
                                     cudaStream_t stream) {
  last_error().clear();
  if (Status st = check_common(p, 16, stream); !st.ok()) return reject(st);
  if (p.q_indptr == nullptr)
    return reject(invalid_argument("prefill launch: q_indptr is required"));
  return detail::enqueue_prefill(make_args(p), max_chunk_tokens, stream);
}

const std::string& last_launch_error() { return last_error(); }

}  // namespace kvtier::kernels::cuda
