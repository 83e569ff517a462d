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
  const bool neg = v & 0x80u;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  float mag;
  if (exp == 0xF && man == 0x7) {
    mag = std::nanf("");
  } else if (exp == 0) {
    mag = static_cast<float>(man) * 0x1p-9f;  // subnormal: man/8 * 2^-6
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  }
  return neg ? -mag : mag;
}

uint8_t float_to_fp8e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7Fu);
  const float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return static_cast<uint8_t>(sign | 0x7Eu);  // saturate to 448
  if (a < 0x1p-6f) {
    // Subnormal range: steps of 2^-9; round to nearest even.
    const float q = std::nearbyint(a * 0x1p9f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));  // q == 8 is the smallest normal
  }
  int e;
  const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  // a = (1 + m/8) * 2^(e-1); mantissa steps of 1/8 at exponent e-1.
  const float scaled = frac * 16.0f;  // in [8, 16)
  float q = std::nearbyint(scaled);   // round to nearest even
  int exp = e - 1 + 7;
  if (q >= 16.0f) {
    q = 8.0f;
    ++exp;
  }
  const uint32_t man = static_cast<uint32_t>(q) - 8u;
  if (exp > 15 || (exp == 15 && man == 7)) return static_cast<uint8_t>(sign | 0x7Eu);
  return static_cast<uint8_t>(sign | (exp << 3) | man);
}

}  // namespace kvtier::kernels
