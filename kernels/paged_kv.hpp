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

// The longest sequence a table may describe. A uint32 would hold 2^32 - 1 tokens, but the kernels
// step through positions in uint32 (tiles, strided token streams, split ranges), and a bound of
// 2^31 leaves every such step room to run past the end without wrapping. It is far above any real
// context (2^31 tokens of the smallest page would fill 32 GiB per layer).
inline constexpr uint32_t kMaxSequenceTokens = uint32_t{1} << 31;

struct ResidencyGuard {
  const ResidencyCheck* check = nullptr;  // nullptr: nothing to check against
  bool enabled = kResidencyCheckDefault;
  // CUDA launchers only (the tables they get live on the device): host copies of kv.indptr
  // ([batch + 1]), kv.indices ([host_indptr[batch]] frame ids), kv.last_page_len ([batch]) and,
  // for prefill, the attention's q_indptr ([batch + 1]). All are required when the guard is
  // enabled with a check (the frames checked must be the frames the kernel reads, and the lengths
  // bound what it reads); with the guard enabled and no check they are used when all are given.
  // The launcher then validates them as the CPU path validates its tables (validate_attention;
  // the fp8 scales stay on the device and are not read) before checking residency. CPU launchers
  // read the tables directly.
  const uint32_t* host_indptr = nullptr;
  const uint32_t* host_indices = nullptr;
  const uint32_t* host_last_page_len = nullptr;
  const uint32_t* host_q_indptr = nullptr;
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
  // Each listed frame's scales must be finite and >= 0 (validate_paged_kv): the page codec writes
  // amax / 448, or 1 for an all-zero half; 0 is accepted as an all-zero half too.
  const float* scales = nullptr;

  uint32_t batch = 0;                       // sequences
  const uint32_t* indptr = nullptr;         // [batch + 1], indptr[0] == 0, non-decreasing
  const uint32_t* indices = nullptr;        // [indptr[batch]] frame ids, in token order
  const uint32_t* last_page_len = nullptr;  // [batch], each in [1, page_tokens]

  // Sizes in bytes; they may wrap for absurd shapes, which validate_kv_shape rejects first.
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

// Checks the shape fields (not the table): sizes, head_dim a multiple of 16 up to 256, a page size
// that fits 64 bits, the stride, and an arena (num_frames * frame_stride from `arena`) inside the
// address space, so that no frame or page address computed from a valid id wraps.
Status validate_kv_shape(const PagedKv& kv);

// Checks a host-readable block table of `batch` sequences: indptr from 0 and growing at every
// sequence (none empty), every frame id below num_frames.
Status validate_block_table(const uint32_t* indptr, const uint32_t* indices, uint32_t batch,
                            uint32_t num_frames);

// Checks shape and a host-readable table: validate_block_table, last_page_len in range, every
// sequence at most kMaxSequenceTokens long, and, for fp8 with scales, the scales of every listed
// frame (finite, >= 0; they are read, so they must be host-readable too: a caller validating the
// host copy of a device table passes its host scales, or scales = nullptr to skip them).
Status validate_paged_kv(const PagedKv& kv);

// Tokens of sequence b (host-readable table). Exact for a table validate_paged_kv accepted;
// others may wrap.
inline uint32_t sequence_length(const PagedKv& kv, uint32_t b) {
  const uint32_t pages = kv.indptr[b + 1] - kv.indptr[b];
  return pages == 0 ? 0 : (pages - 1) * kv.page_tokens + kv.last_page_len[b];
}

}  // namespace kvtier::kernels
