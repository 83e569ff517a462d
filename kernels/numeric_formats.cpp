#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels {

float f16_to_float(uint16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x8000u) << 16;
  const uint32_t exp = (v >> 10) & 0x1Fu;
  const uint32_t man = v & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F80'0000u | (man << 13));  // inf/NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  // Subnormal: value = man * 2^-24.
  const float mag = static_cast<float>(man) * 0x1p-24f;
  return sign ? -mag : mag;
}

uint16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFF'FFFFu;
  if (abs > 0x7F80'0000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (abs < 0x3880'0000u) {  // below 2^-14: subnormal or zero in f16
    // Round abs * 2^24 to nearest even integer.
    const float mag = std::bit_cast<float>(abs) * 0x1p24f;
    const float r = std::nearbyint(mag);  // default rounding mode is round-to-nearest-even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  if (abs >= 0x477F'F000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (nearest even).
  uint32_t m = abs - (112u << 23);
  m += 0xFFFu + ((m >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(m >> 13));
}

float fp8e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xF && man == 0x7) return std::bit_cast<float>(sign | 0x7FC0'0000u);  // NaN
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;  // subnormal: man/8 * 2^-6
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (man << 20));  // bias 7 -> 127
}

uint8_t float_to_fp8e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7FFF'FFFFu;
  if (abs > 0x7F80'0000u) return static_cast<uint8_t>(sign | 0x7Fu);   // NaN
  if (abs >= 0x43E0'0000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (and inf) saturate
  if (abs < 0x3C80'0000u) {
    // Below 2^-6, the subnormal steps of 2^-9: adding 2^23 to |f| * 2^9 leaves the rounded-to-
    // nearest-even integer in the low mantissa bits. 8 is the encoding of the smallest normal.
    const float shifted = std::bit_cast<float>(abs) * 0x1p9f + 0x1p23f;
    return static_cast<uint8_t>(sign | (std::bit_cast<uint32_t>(shifted) & 0xFu));
  }
  // Normal: round the mantissa from 23 to 3 bits (nearest even); a carry moves into the exponent.
  // Exponent bias 127 becomes 7, so the code is (bits >> 20) - (120 << 3). Inputs below 448 round
  // to at most 0x7E.
  const uint32_t rounded = abs + 0x7'FFFFu + ((abs >> 20) & 1u);
  return static_cast<uint8_t>(sign | ((rounded >> 20) - (120u << 3)));
}

}  // namespace kvtier::kernels
