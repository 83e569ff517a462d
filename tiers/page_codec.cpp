#include "tiers/page_codec.hpp"

#include <cmath>
#include <cstring>

#include "kernels/cpu/frame_ops.hpp"

namespace kvtier {
namespace {

const kernels::cpu::IsaKernels& simd() {
  static const kernels::cpu::IsaKernels* isa = kernels::cpu::isa_kernels(kernels::cpu::Isa::kAuto);
  return *isa;
}

}  // namespace

bool encode_page(const PageFormat& f, const std::byte* wide, std::byte* out) {
  const std::size_t half = f.half_elems();
  float scales[2];
  const bool ok =
      kernels::cpu::quantize_page_fp8(simd(), wide, f.geometry.dtype, half,
                                      reinterpret_cast<uint8_t*>(out), &scales[0], &scales[1]);
  std::memcpy(out + 2 * half, scales, sizeof(scales));
  return ok;
}

void decode_page(const PageFormat& f, const std::byte* stored, std::byte* wide) {
  const std::size_t half = f.half_elems();
  float scales[2];
  std::memcpy(scales, stored + 2 * half, sizeof(scales));
  kernels::cpu::dequantize_page_fp8(simd(), reinterpret_cast<const uint8_t*>(stored), scales[0],
                                    scales[1], f.geometry.dtype, half, wide);
}

bool encoded_page_refused(const PageFormat& f, const std::byte* stored) {
  float scales[2];
  std::memcpy(scales, stored + 2 * f.half_elems(), sizeof(scales));
  return std::isnan(scales[0]) || std::isnan(scales[1]);
}

}  // namespace kvtier
