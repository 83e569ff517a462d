// Scalar conversions between float and the KV storage formats: f16 (IEEE binary16), bf16 and
// fp8 e4m3 (OCP FP8, "e4m3fn": no infinities, max 448, one NaN pattern per sign).
//
// These are the exact, portable definitions every other piece agrees with: the CPU kernels use them
// (or SIMD forms that must match them bit for bit), the tests use them to build inputs, and the CUDA
// kernels are tested against results computed through them. float -> narrow rounds to nearest even;
// fp8 saturates to +-448 (finite inputs) as quantizers in serving engines do, NaN stays NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace kvtier::kernels {

inline float bf16_to_float(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFF'FFFFu) > 0x7F80'0000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t v);
uint16_t float_to_f16(float f);

float fp8e4m3_to_float(uint8_t v);
uint8_t float_to_fp8e4m3(float f);

constexpr float kFp8E4M3Max = 448.0f;

}  // namespace kvtier::kernels
