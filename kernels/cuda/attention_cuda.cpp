#include "kernels/cuda/attention_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/launch_args.hpp"
#include "kvtier/log.hpp"

namespace kvtier::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr uint32_t kMinSplitTokens = 256;
// CUDA grid limits: y and z dimensions (batch, kv_heads), x (decode splits, the merge's heads).
constexpr uint32_t kMaxGridYZ = 65535;
constexpr uint64_t kMaxGridX = 0x7fffffff;

static_assert(detail::kMaxSequenceTokens == kMaxSequenceTokens,
              "the kernels' length bound must be paged_kv.hpp's");

std::string& last_error() {
  thread_local std::string message;
  return message;
}

cudaError_t reject(const Status& st) {
  last_error() = st.to_string();
  log(LogLevel::kError, "CUDA attention launch rejected: " + last_error());
  return cudaErrorInvalidValue;
}

// The residency guard's host copies of the tables (paged_kv.hpp): validated as the CPU path
// validates its own (whole table, lengths, chunks no longer than their sequences), then every
// frame they list checked for residency. Required with a check; used when all are given without
// one; skipped otherwise (the kernels still stay inside each sequence's pages, writing NaN for a
// malformed one, but cannot say why).
Status check_host_tables(const AttentionParams& p, bool prefill) {
  const ResidencyGuard& g = p.residency;
  if (!g.enabled || p.kv.batch == 0) return ok_status();
  std::string missing;
  const auto require = [&missing](const uint32_t* ptr, const char* name) {
    if (ptr == nullptr) missing += std::string(missing.empty() ? "" : ", ") + "residency." + name;
  };
  require(g.host_indptr, "host_indptr");
  require(g.host_indices, "host_indices");
  require(g.host_last_page_len, "host_last_page_len");
  if (prefill) require(g.host_q_indptr, "host_q_indptr");
  if (!missing.empty()) {
    if (g.check == nullptr) return ok_status();
    return invalid_argument("attention launch: residency checking is on but " + missing +
                            " is null (the host copies of the device tables it checks)");
  }
  AttentionParams host = p;
  host.kv.indptr = g.host_indptr;
  host.kv.indices = g.host_indices;
  host.kv.last_page_len = g.host_last_page_len;
  host.kv.scales = nullptr;  // device memory
  host.q_indptr = prefill ? g.host_q_indptr : nullptr;
  KVTIER_RETURN_IF_ERROR(
      validate_attention(host).with_context("attention launch: residency host tables"));
  return check_residency(g, g.host_indices, g.host_indptr[p.kv.batch]);
}

// The kernels load these as 32-bit words: a misaligned one would fault on the device (a sticky
// error for the whole context) instead of being refused here.
Status check_alignment(const AttentionParams& p) {
  const void* scales = p.kv.dtype == Dtype::kFP8E4M3 ? p.kv.scales : nullptr;
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{p.q, "q"},
                                  {p.out, "out"},
                                  {p.lse, "lse"},
                                  {scales, "kv.scales"},
                                  {p.kv.indptr, "kv.indptr"},
                                  {p.kv.indices, "kv.indices"},
                                  {p.kv.last_page_len, "kv.last_page_len"},
                                  {p.q_indptr, "q_indptr"}}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 4 != 0) {
      return invalid_argument("attention launch: " + std::string(name) + " (" +
                              std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                              ") is not 4-byte aligned");
    }
  }
  return ok_status();
}

Status check_common(const AttentionParams& p, uint32_t max_group, bool prefill,
                    cudaStream_t stream) {
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
  KVTIER_RETURN_IF_ERROR(check_alignment(p));
  // Grid (.., kv_heads, batch) for decode, (.., batch, kv_heads) for prefill.
  if (p.kv.batch > kMaxGridYZ || p.kv.kv_heads > kMaxGridYZ) {
    return invalid_argument("attention launch: batch " + std::to_string(p.kv.batch) +
                            " and kv_heads " + std::to_string(p.kv.kv_heads) +
                            " must each be at most " + std::to_string(kMaxGridYZ) +
                            " (the CUDA grid's y and z limit); launch a larger batch in parts");
  }
  if (!std::isfinite(p.sm_scale)) {
    return invalid_argument("attention launch: sm_scale " + std::to_string(p.sm_scale) +
                            " is not finite");
  }
  return check_host_tables(p, prefill);
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
  if (Status st = check_common(p, 8, /*prefill=*/false, stream); !st.ok()) return reject(st);
  if (p.q_indptr != nullptr) {
    return reject(
        invalid_argument("decode launch: q_indptr must be null (one query per sequence)"));
  }
  if (splits == 0) return reject(invalid_argument("decode launch: splits must be at least 1"));
  if (splits > kMaxGridX ||
      (splits > 1 && static_cast<uint64_t>(p.kv.batch) * p.num_qo_heads > kMaxGridX)) {
    return reject(invalid_argument(
        "decode launch: " + std::to_string(splits) + " splits of " + std::to_string(p.kv.batch) +
        " sequences x " + std::to_string(p.num_qo_heads) +
        " query heads exceed the CUDA grid's x limit (splits, and batch x heads to merge them)"));
  }
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
  if (Status st = check_common(p, 16, /*prefill=*/true, stream); !st.ok()) return reject(st);
  if (p.q_indptr == nullptr) {
    return reject(invalid_argument("prefill launch: q_indptr is required"));
  }
  return detail::enqueue_prefill(make_args(p), max_chunk_tokens, stream);
}

const std::string& last_launch_error() { return last_error(); }

}  // namespace kvtier::kernels::cuda
