#include "kernels/paged_kv.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace kvtier::kernels {

Status check_residency(const ResidencyGuard& guard, const uint32_t* indices, uint32_t nnz) {
  if (!guard.enabled || guard.check == nullptr) return ok_status();
  if (nnz > 0 && indices == nullptr) {
    return invalid_argument("residency check: the block table has " + std::to_string(nnz) +
                            " entries but no host-readable indices");
  }
  for (uint32_t i = 0; i < nnz; ++i) {
    if (!guard.check->is_resident(indices[i])) {
      return failed_precondition("frame " + std::to_string(indices[i]) + " (block table entry " +
                                 std::to_string(i) +
                                 ") is not resident in HBM for this step; the kernel was not run");
    }
  }
  return ok_status();
}

Status validate_kv_shape(const PagedKv& kv) {
  if (kv.kv_heads == 0 || kv.page_tokens == 0) {
    return invalid_argument("paged KV: kv_heads (" + std::to_string(kv.kv_heads) +
                            ") and page_tokens (" + std::to_string(kv.page_tokens) +
                            ") must be positive");
  }
  // 16 keeps every SIMD width and the CUDA 8-element vectors whole; 256 bounds per-thread state.
  if (kv.head_dim == 0 || kv.head_dim % 16 != 0 || kv.head_dim > 256) {
    return invalid_argument("paged KV: head_dim " + std::to_string(kv.head_dim) +
                            " is not a multiple of 16 in [16, 256]");
  }
  if (dtype_size(kv.dtype) == 0) {
    return invalid_argument("paged KV: unknown dtype code " +
                            std::to_string(static_cast<int>(kv.dtype)));
  }
  // Checked: page_bytes() wraps in 64 bits for absurd shapes (to 0 for 2^31 heads and tokens),
  // which would let any frame_stride pass the check below.
  uint64_t page_bytes = 0;
  if (__builtin_mul_overflow(uint64_t{kv.kv_heads} * kv.head_dim * dtype_size(kv.dtype),
                             uint64_t{kv.page_tokens}, &page_bytes) ||
      __builtin_mul_overflow(page_bytes, uint64_t{2}, &page_bytes)) {
    return invalid_argument(
        "paged KV: the page size overflows 64 bits (2 x " + std::to_string(kv.page_tokens) +
        " tokens x " + std::to_string(kv.kv_heads) + " heads x " + std::to_string(kv.head_dim) +
        " x " + std::to_string(dtype_size(kv.dtype)) + " bytes)");
  }
  if (kv.frame_stride < page_bytes) {
    return invalid_argument("paged KV: frame_stride " + std::to_string(kv.frame_stride) +
                            " is below the page size " + std::to_string(page_bytes));
  }
  if (kv.arena == nullptr || kv.num_frames == 0) {
    return invalid_argument("paged KV: no arena (null base or zero frames)");
  }
  uint64_t arena_bytes = 0;
  if (__builtin_mul_overflow(uint64_t{kv.num_frames}, kv.frame_stride, &arena_bytes) ||
      arena_bytes > std::numeric_limits<uintptr_t>::max() - reinterpret_cast<uintptr_t>(kv.arena)) {
    return invalid_argument("paged KV: " + std::to_string(kv.num_frames) + " frames of " +
                            std::to_string(kv.frame_stride) +
                            " bytes from the arena base run past the end of the address space");
  }
  return ok_status();
}

Status validate_block_table(const uint32_t* indptr, const uint32_t* indices, uint32_t batch,
                            uint32_t num_frames) {
  if (batch == 0) return ok_status();
  if (indptr == nullptr) {
    return invalid_argument("paged KV: indptr is required for a batch of " + std::to_string(batch));
  }
  if (indptr[0] != 0) {
    return invalid_argument("paged KV: indptr[0] is " + std::to_string(indptr[0]) + ", expected 0");
  }
  for (uint32_t b = 0; b < batch; ++b) {
    if (indptr[b + 1] < indptr[b]) {
      return invalid_argument("paged KV: indptr decreases at sequence " + std::to_string(b));
    }
    if (indptr[b + 1] == indptr[b]) {
      return invalid_argument("paged KV: sequence " + std::to_string(b) + " has no pages");
    }
  }
  const uint32_t nnz = indptr[batch];
  if (indices == nullptr) return invalid_argument("paged KV: indices is null");
  for (uint32_t i = 0; i < nnz; ++i) {
    if (indices[i] >= num_frames) {
      return out_of_range("paged KV: block table entry " + std::to_string(i) + " names frame " +
                          std::to_string(indices[i]) + " of an arena of " +
                          std::to_string(num_frames) + " frames");
    }
  }
  return ok_status();
}

Status validate_paged_kv(const PagedKv& kv) {
  KVTIER_RETURN_IF_ERROR(validate_kv_shape(kv));
  if (kv.batch == 0) return ok_status();
  if (kv.indptr == nullptr || kv.last_page_len == nullptr) {
    return invalid_argument("paged KV: indptr and last_page_len are required for a batch of " +
                            std::to_string(kv.batch));
  }
  KVTIER_RETURN_IF_ERROR(validate_block_table(kv.indptr, kv.indices, kv.batch, kv.num_frames));
  for (uint32_t b = 0; b < kv.batch; ++b) {
    if (kv.last_page_len[b] == 0 || kv.last_page_len[b] > kv.page_tokens) {
      return invalid_argument("paged KV: last_page_len of sequence " + std::to_string(b) + " is " +
                              std::to_string(kv.last_page_len[b]) + ", outside [1, " +
                              std::to_string(kv.page_tokens) + "]");
    }
    // In 64 bits: the uint32 sum of sequence_length() wraps (65537 pages of 65536 tokens hold 1).
    const uint64_t pages = kv.indptr[b + 1] - kv.indptr[b];
    const uint64_t tokens = (pages - 1) * kv.page_tokens + kv.last_page_len[b];
    if (tokens > kMaxSequenceTokens) {
      return invalid_argument(
          "paged KV: sequence " + std::to_string(b) + " has " + std::to_string(pages) +
          " pages of " + std::to_string(kv.page_tokens) + " tokens, " + std::to_string(tokens) +
          " tokens in all, above the limit of " + std::to_string(kMaxSequenceTokens));
    }
  }
  if (kv.dtype == Dtype::kFP8E4M3 && kv.scales != nullptr) {
    // Once per listed frame and launch. NaN or inf would poison every row that reads the page; a
    // negative scale is nothing the codec writes (it writes amax / 448, or 1 for an all-zero
    // half), so it is taken for corruption. 0 is a legitimate all-zero half.
    const uint32_t nnz = kv.indptr[kv.batch];
    for (uint32_t i = 0; i < nnz; ++i) {
      const uint32_t frame = kv.indices[i];
      for (int part = 0; part < 2; ++part) {
        const float scale = kv.scales[2 * static_cast<std::size_t>(frame) + part];
        if (!(scale >= 0.0f) || std::isinf(scale)) {
          return invalid_argument("paged KV: frame " + std::to_string(frame) +
                                  " (block table entry " + std::to_string(i) + ") has " +
                                  (part == 0 ? "k_scale " : "v_scale ") + std::to_string(scale) +
                                  "; fp8 scales must be finite and >= 0");
        }
      }
    }
  }
  return ok_status();
}

}  // namespace kvtier::kernels
