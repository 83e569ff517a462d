// A batch of whole pages to re-encode between the model's dtype and PageFormat's fp8 layout
// (include/kvtier/types.hpp), for the CUDA launchers in kernels/cuda/page_codec_cuda.hpp.
//
// An HBM -> host copy of a tier that stores fp8 encodes: the kernel reads the wide page (HBM) and
// writes [K e4m3][V e4m3][k_scale f32][v_scale f32] straight into the host frame (mapped pinned
// memory); host -> HBM decodes the other way. The arithmetic is kernels::cpu::quantize_page_fp8 /
// dequantize_page_fp8's, so a page encoded on either side decodes to the same bytes on either.
//
// Pages are scattered (frames in any order, in either memory), so the batch names every page by
// pointer instead of a base and frame ids: no device-side index list to upload, and the same
// batch serves device, mapped-host and mixed placements. The struct is plain data passed by value
// as a kernel parameter, hence the fixed kMaxPages; a copy engine splits larger requests.
// Rejected: a frame-id form like Fp8FramesParams (the host and HBM arenas have different strides
// and bases per direction, and the trailer would need a separate scales array).
//
// Pointers are borrowed until the stream has run the work. validate_page_codec_batch is pure and
// thread-safe; it reads only the pointer values, never the pages.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::kernels {

struct PageCodecBatch {
  static constexpr uint32_t kMaxPages = 128;  // keeps sizeof well under the 4 KiB kernel params

  Dtype wide = Dtype::kBF16;  // f32, f16 or bf16: the model's dtype (the HBM side)
  uint64_t half_elems = 0;    // elements of K (or V) of one page
  uint32_t count = 0;         // pages in src[0, count) / dst[0, count)
  // Encode: src[i] is a wide page [2][half_elems] of `wide`, dst[i] an fp8 page of
  // fp8_page_bytes(). Decode: the reverse. Device or mapped pinned host pointers, each aligned to
  // the wide dtype's size (frames are 4096-aligned; 16-byte aligned pages take the wide path).
  const void* src[kMaxPages] = {};
  void* dst[kMaxPages] = {};

  // [K fp8][V fp8][k_scale][v_scale]: PageFormat::page_bytes() of an encoding format.
  uint64_t fp8_page_bytes() const { return 2 * half_elems + PageFormat::kScaleTrailerBytes; }
  uint64_t wide_page_bytes() const { return 2 * half_elems * dtype_size(wide); }
};
static_assert(std::is_trivially_copyable_v<PageCodecBatch>, "passed by value to kernels");
static_assert(sizeof(PageCodecBatch) <= 2200, "kernel parameter block grew");

// Largest half page accepted: far above any real page, small enough that no offset overflows.
inline constexpr uint64_t kMaxPageCodecHalfElems = uint64_t{1} << 32;

enum class PageCodecOp : uint8_t { kEncode, kDecode };

// Checks the wide dtype, half_elems, count <= kMaxPages, that no page pointer in [0, count) is
// null or misaligned for `wide`, that no two destination pages overlap and that no source page
// overlaps a destination (pages in place would race between blocks), with `op`'s page sizes.
// Messages name the entry. The launchers run it before enqueueing anything.
Status validate_page_codec_batch(const PageCodecBatch& b, PageCodecOp op);
// The same without the direction: overlaps are checked over the shorter of the two page sizes.
Status validate_page_codec_batch(const PageCodecBatch& b);

}  // namespace kvtier::kernels
