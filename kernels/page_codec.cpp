#include "kernels/page_codec.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

namespace kvtier::kernels {
namespace {

struct Span {
  uintptr_t begin;
  uintptr_t end;
  uint32_t entry;
};

std::string entry_name(uint32_t i) { return "page codec: entry " + std::to_string(i); }

Status check(const PageCodecBatch& b, uint64_t src_bytes, uint64_t dst_bytes) {
  if (b.wide == Dtype::kFP8E4M3 || dtype_size(b.wide) == 0) {
    return invalid_argument(
        std::string("page codec: the wide dtype must be f32, f16 or bf16, not ") +
        std::string(dtype_name(b.wide)));
  }
  if (b.half_elems == 0 || b.half_elems > kMaxPageCodecHalfElems) {
    return invalid_argument("page codec: half_elems " + std::to_string(b.half_elems) +
                            " is zero or above " + std::to_string(kMaxPageCodecHalfElems));
  }
  if (b.count > PageCodecBatch::kMaxPages) {
    return invalid_argument("page codec: " + std::to_string(b.count) +
                            " pages in one batch, above kMaxPages " +
                            std::to_string(PageCodecBatch::kMaxPages));
  }
  const uintptr_t align = dtype_size(b.wide);
  std::array<Span, PageCodecBatch::kMaxPages> dsts;
  for (uint32_t i = 0; i < b.count; ++i) {
    for (const auto& [ptr, what, bytes] :
         {std::tuple{static_cast<const void*>(b.src[i]), "source", src_bytes},
          std::tuple{static_cast<const void*>(b.dst[i]), "destination", dst_bytes}}) {
      if (ptr == nullptr) return invalid_argument(entry_name(i) + ": " + what + " page is null");
      const auto addr = reinterpret_cast<uintptr_t>(ptr);
      if (addr % align != 0) {
        return invalid_argument(entry_name(i) + ": " + what + " page " + std::to_string(addr) +
                                " is not aligned to the " + std::to_string(align) + "-byte " +
                                std::string(dtype_name(b.wide)) + " elements");
      }
      if (addr > std::numeric_limits<uintptr_t>::max() - bytes) {
        return invalid_argument(entry_name(i) + ": " + what + " page " + std::to_string(addr) +
                                " runs past the end of the address space");
      }
    }
    const auto d = reinterpret_cast<uintptr_t>(b.dst[i]);
    dsts[i] = Span{d, d + dst_bytes, i};
  }
  const auto end = dsts.begin() + b.count;
  std::sort(dsts.begin(), end, [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (auto it = dsts.begin(); it != end && it + 1 != end; ++it) {
    if ((it + 1)->begin < it->end) {
      return invalid_argument(entry_name(it->entry) + " and entry " +
                              std::to_string((it + 1)->entry) +
                              " write overlapping destination pages");
    }
  }
  // Disjoint and sorted by begin, so sorted by end too: the first destination ending after a
  // source begins is the only one that can overlap it from the left.
  for (uint32_t i = 0; i < b.count; ++i) {
    const auto s = reinterpret_cast<uintptr_t>(b.src[i]);
    const auto hit = std::upper_bound(dsts.begin(), end, s,
                                      [](uintptr_t v, const Span& d) { return v < d.end; });
    if (hit != end && hit->begin < s + src_bytes) {
      return invalid_argument(
          entry_name(i) + ": source page overlaps the destination page of entry " +
          std::to_string(hit->entry) + " (pages cannot be re-encoded in place)");
    }
  }
  return ok_status();
}

}  // namespace

Status validate_page_codec_batch(const PageCodecBatch& b, PageCodecOp op) {
  const uint64_t wide = b.wide_page_bytes();
  const uint64_t fp8 = b.fp8_page_bytes();
  return op == PageCodecOp::kEncode ? check(b, wide, fp8) : check(b, fp8, wide);
}

Status validate_page_codec_batch(const PageCodecBatch& b) {
  const uint64_t shorter = std::min(b.wide_page_bytes(), b.fp8_page_bytes());
  return check(b, shorter, shorter);
}

}  // namespace kvtier::kernels
