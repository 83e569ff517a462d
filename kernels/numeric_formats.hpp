// Scalar conversions between float and the KV storage formats: f16 (IEEE binary16), bf16 and
// fp8 e4m3 (OCP FP8, "e4m3fn": no infinities, max 448, one NaN pattern per sign).
//
// These are the exact, portable definitions every other piece agrees with: the CPU kernels use them
// (or SIMD forms that must match them bit for bit), the tests use them to build inputs, and the
// CUDA kernels are tested against results computed through them. float -> narrow rounds to nearest
// even; fp8 saturates to +-448 (finite inputs) as quantizers in serving engines do, NaN stays NaN.
//
// The fp8 encoder works on the float's bits (no frexp/ldexp) because page quantization runs it
// once per element of every offloaded page; the SIMD encoders in kernels/cpu repeat the same steps
// lane-wise and are tested against it. `load_as_float` / `store_from_float` are the per-element
// forms over a Dtype, for references and tails, not for loops that need speed.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvtier/types.hpp"

namespace kvtier::kernels {

inline float bf16_to_float(uint16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
}

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

// Element `i` of a buffer of `dtype`, widened to float.
inline float load_as_float(const void* src, Dtype dtype, std::size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case Dtype::kF32: {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      return f;
    }
    case Dtype::kF16:
    case Dtype::kBF16: {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return dtype == Dtype::kF16 ? f16_to_float(h) : bf16_to_float(h);
    }
    case Dtype::kFP8E4M3: return fp8e4m3_to_float(bytes[i]);
  }
  return 0.0f;
}

// Stores `value` as element `i` of a buffer of `dtype`, rounding to nearest even.
inline void store_from_float(void* dst, Dtype dtype, std::size_t i, float value) {
  auto* bytes = static_cast<uint8_t*>(dst);
  switch (dtype) {
    case Dtype::kF32: std::memcpy(bytes + 4 * i, &value, 4); return;
    case Dtype::kF16:
    case Dtype::kBF16: {
      const uint16_t h = dtype == Dtype::kF16 ? float_to_f16(value) : float_to_bf16(value);
      std::memcpy(bytes + 2 * i, &h, 2);
      return;
    }
    case Dtype::kFP8E4M3: bytes[i] = float_to_fp8e4m3(value); return;
  }
}

}  // namespace kvtier::kernels
