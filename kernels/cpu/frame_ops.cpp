#include "kernels/cpu/frame_ops.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels::cpu {
namespace {

// Below this many bytes per call a single thread copies: task overhead would dominate.
constexpr std::size_t kParallelCopyBytes = 4u << 20;

template <typename Fn>
void for_each_frame(uint32_t count, std::size_t bytes_per_frame, Fn&& fn) {
  const std::size_t total = bytes_per_frame * count;
  if (total < kParallelCopyBytes || count < 2) {
    for (uint32_t i = 0; i < count; ++i) fn(i);
    return;
  }
  const std::size_t grain =
      std::max<std::size_t>(1, (1u << 20) / std::max<std::size_t>(1, bytes_per_frame));
  tbb::parallel_for(tbb::blocked_range<uint32_t>(0, count, grain),
                    [&](const tbb::blocked_range<uint32_t>& r) {
                      for (uint32_t i = r.begin(); i != r.end(); ++i) fn(i);
                    });
}

float quantize_half(const IsaKernels& isa, const uint8_t* src, Dtype dtype, std::size_t n,
                    uint8_t* dst) {
  const float amax = isa.abs_max(src, dtype, n);
  if (!std::isfinite(amax)) {
    std::memset(dst, 0, n);
    return std::numeric_limits<float>::quiet_NaN();
  }
  float inv = amax > 0.0f ? kFp8E4M3Max / amax : 1.0f;
  float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
  if (std::isinf(inv)) {
    // amax below 448 / FLT_MAX (f32 or bf16 pages only): 448 / amax overflows, and x * inf
    // would turn the zeros into NaN codes. Every value is then within 1.4e-36 of zero, and the
    // half encodes as (signed) zeros with scale 1, as an all-zero half does.
    inv = 0.0f;
    scale = 1.0f;
  }
  isa.convert(src, dtype, inv, dst, Dtype::kFP8E4M3, n);
  return scale;
}

const IsaKernels* kernels_or_null(Isa isa) { return isa_kernels(isa); }

}  // namespace

bool quantize_page_fp8(const IsaKernels& isa, const void* src, Dtype dtype, std::size_t half_elems,
                       uint8_t* dst, float* k_scale, float* v_scale) {
  const auto* s = static_cast<const uint8_t*>(src);
  *k_scale = quantize_half(isa, s, dtype, half_elems, dst);
  *v_scale =
      quantize_half(isa, s + half_elems * dtype_size(dtype), dtype, half_elems, dst + half_elems);
  return !std::isnan(*k_scale) && !std::isnan(*v_scale);
}

void dequantize_page_fp8(const IsaKernels& isa, const uint8_t* src, float k_scale, float v_scale,
                         Dtype dtype, std::size_t half_elems, void* dst) {
  auto* d = static_cast<uint8_t*>(dst);
  isa.convert(src, Dtype::kFP8E4M3, k_scale, d, dtype, half_elems);
  isa.convert(src + half_elems, Dtype::kFP8E4M3, v_scale, d + half_elems * dtype_size(dtype), dtype,
              half_elems);
}

Status gather_frames(const FrameCopyParams& p) {
  KVTIER_RETURN_IF_ERROR(validate_frame_copy(p, /*check_distinct=*/false));
  for_each_frame(p.count, p.frame_bytes, [&](uint32_t i) {
    std::memcpy(p.staging + i * p.frame_bytes, p.arena + p.frames[i] * p.frame_stride,
                p.frame_bytes);
  });
  return ok_status();
}

Status scatter_frames(const FrameCopyParams& p) {
  try {
    KVTIER_RETURN_IF_ERROR(validate_frame_copy(p, /*check_distinct=*/true));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("scatter: out of memory checking " + std::to_string(p.count) +
                              " frame ids");
  }
  for_each_frame(p.count, p.frame_bytes, [&](uint32_t i) {
    std::memcpy(p.arena + p.frames[i] * p.frame_stride, p.staging + i * p.frame_bytes,
                p.frame_bytes);
  });
  return ok_status();
}

Status quantize_frames_fp8(const Fp8FramesParams& p, Isa isa_choice) {
  const IsaKernels* isa = kernels_or_null(isa_choice);
  if (isa == nullptr) {
    return unavailable(std::string("fp8 quantize: this CPU cannot run ") + isa_name(isa_choice));
  }
  KVTIER_RETURN_IF_ERROR(validate_fp8_frames(p, /*check_distinct=*/false));
  const std::size_t half = p.half_elems();
  for_each_frame(p.count, p.wide_page_bytes(), [&](uint32_t i) {
    quantize_page_fp8(*isa, p.arena + p.frames[i] * p.frame_stride, p.dtype, half,
                      p.staging + i * p.fp8_page_bytes(), &p.scales[2 * i], &p.scales[2 * i + 1]);
  });
  for (uint32_t i = 0; i < p.count; ++i) {
    if (std::isnan(p.scales[2 * i]) || std::isnan(p.scales[2 * i + 1])) {
      return invalid_argument("fp8 quantize: frame " + std::to_string(p.frames[i]) + " (entry " +
                              std::to_string(i) + ") holds NaN or inf in its " +
                              (std::isnan(p.scales[2 * i]) ? "K" : "V") + " half");
    }
  }
  return ok_status();
}

Status dequantize_frames_fp8(const Fp8FramesParams& p, Isa isa_choice) {
  const IsaKernels* isa = kernels_or_null(isa_choice);
  if (isa == nullptr) {
    return unavailable(std::string("fp8 dequantize: this CPU cannot run ") + isa_name(isa_choice));
  }
  try {
    KVTIER_RETURN_IF_ERROR(validate_fp8_frames(p, /*check_distinct=*/true));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("fp8 dequantize: out of memory checking " + std::to_string(p.count) +
                              " frame ids");
  }
  // As attention (validate_paged_kv): the quantizer only writes finite scales >= 0, so any other
  // is a corrupt entry, refused before a frame is written (a negative one would flip every sign).
  for (uint32_t i = 0; i < p.count; ++i) {
    for (int part = 0; part < 2; ++part) {
      const float scale = p.scales[2 * i + part];
      if (!std::isfinite(scale) || scale < 0.0f) {
        return invalid_argument("fp8 dequantize: entry " + std::to_string(i) + " (frame " +
                                std::to_string(p.frames[i]) + ") has " + (part == 0 ? "K" : "V") +
                                " scale " + std::to_string(scale) +
                                "; fp8 scales must be finite and >= 0");
      }
    }
  }
  const std::size_t half = p.half_elems();
  for_each_frame(p.count, p.wide_page_bytes(), [&](uint32_t i) {
    dequantize_page_fp8(*isa, p.staging + i * p.fp8_page_bytes(), p.scales[2 * i],
                        p.scales[2 * i + 1], p.dtype, half, p.arena + p.frames[i] * p.frame_stride);
  });
  return ok_status();
}

}  // namespace kvtier::kernels::cpu
