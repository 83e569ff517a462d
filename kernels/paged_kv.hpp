// The paged KV view every kernel reads: an arena of frames, a CSR block table and the residency
// guard that keeps kernels to pages pinned in HBM.
//
// Owns nothing: all pointers are borrowed for the duration of one call (CPU) or until the stream
// has run the launched work (CUDA, where they are device pointers except where marked host).
// A frame holds one page of one layer: K then V, each [page_tokens][kv_heads][head_dim] of `dtype`
// (include/kvtier/types.hpp); frame f starts at arena + f * frame_stride. A sequence's pages are
// indices[indptr[b] .. indptr[b+1]) in token order and its last page holds last_page_len[b] tokens,
// so its length is (pages - 1) * page_tokens + last_page_len[b] (the CSR layout of FlashInfer's
// paged KV). fp8 pages keep raw e4m3 bytes; their scales live beside the arena, indexed by frame,
// so a page stays a multiple of 512 bytes for direct I/O.
//
// Residency: the page table sits above kernels/, so kernels cannot ask it directly. It implements
// ResidencyCheck; launchers consult it on every listed frame before reading anything, when the
// guard is enabled (by default in debug builds, or with KVTIER_CHECK_RESIDENCY; tests enable it
// explicitly). Rejected: a check inside the kernels (a virtual call per token on the hot path,
// impossible on the GPU) and a compile-time-only switch (release-build tests could not prove it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::kernels {

#if !defined(NDEBUG) || defined(KVTIER_CHECK_RESIDENCY)
inline constexpr bool kResidencyCheckDefault = true;
#else
inline constexpr bool kResidencyCheckDefault = false;
#endif

// Implemented by the owner of the page table. Called on the launching thread, once per listed
// frame, before the kernel reads anything; it must not block.
class ResidencyCheck {
 public:
  virtual ~ResidencyCheck() = default;
  // True when `frame` holds a complete page that is pinned in HBM for the current step.
  virtual bool is_resident(uint32_t frame) const = 0;
};

struct ResidencyGuard {
  const ResidencyCheck* check = nullptr;  // nullptr: nothing to check against
  bool enabled = kResidencyCheckDefault;
  // CUDA launchers only (the block table they get lives on the device): host copies of
  // kv.indptr ([batch + 1]) and kv.indices ([host_indptr[batch]] frame ids). Both are required
  // when the guard is enabled with a check: without them nothing could be checked. CPU
  // launchers read kv.indptr and kv.indices directly.
  const uint32_t* host_indptr = nullptr;
  const uint32_t* host_indices = nullptr;
};

struct PagedKv {
  const uint8_t* arena = nullptr;  // [num_frames][frame_stride] bytes
  uint64_t frame_stride = 0;       // bytes between frames, >= page_bytes()
  uint32_t num_frames = 0;         // frame ids must be below this
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_tokens = 0;
  Dtype dtype = Dtype::kBF16;
  // fp8_e4m3 only: [num_frames][2] = (k_scale, v_scale); value = fp8 * scale. nullptr = 1.0.
  const float* scales = nullptr;

  uint32_t batch = 0;                       // sequences
  const uint32_t* indptr = nullptr;         // [batch + 1], indptr[0] == 0, non-decreasing
  const uint32_t* indices = nullptr;        // [indptr[batch]] frame ids, in token order
  const uint32_t* last_page_len = nullptr;  // [batch], each in [1, page_tokens]

  std::size_t token_bytes() const {  // K (or V) of one token, all heads
    return static_cast<std::size_t>(kv_heads) * head_dim * dtype_size(dtype);
  }
  std::size_t page_bytes() const {
    return 2 * static_cast<std::size_t>(page_tokens) * token_bytes();
  }
};

// Fills the shape fields of a PagedKv from the model geometry (layers and the table stay unset).
inline PagedKv paged_kv_for(const Geometry& g) {
  PagedKv kv;
  kv.kv_heads = g.kv_heads;
  kv.head_dim = g.head_dim;
  kv.page_tokens = g.page_tokens;
  kv.dtype = g.dtype;
  return kv;
}

// OK when the guard is disabled or has no check; otherwise failed_precondition naming the first
// frame (and its position in the table) that is not resident.
Status check_residency(const ResidencyGuard& guard, const uint32_t* indices, uint32_t nnz);

// Checks the shape fields (not the table): sizes, head_dim a multiple of 16 up to 256, stride.
Status validate_kv_shape(const PagedKv& kv);

// Checks a host-readable block table of `batch` sequences: indptr from 0 and growing at every
// sequence (none empty), every frame id below num_frames.
Status validate_block_table(const uint32_t* indptr, const uint32_t* indices, uint32_t batch,
                            uint32_t num_frames);

// Checks shape and a host-readable table: validate_block_table, and last_page_len in range.
Status validate_paged_kv(const PagedKv& kv);

// Tokens of sequence b (host-readable table).
inline uint32_t sequence_length(const PagedKv& kv, uint32_t b) {
  const uint32_t pages = kv.indptr[b + 1] - kv.indptr[b];
  return pages == 0 ? 0 : (pages - 1) * kv.page_tokens + kv.last_page_len[b];
}

}  // namespace kvtier::kernels
