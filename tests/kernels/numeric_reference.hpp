// Independent reference definitions of the narrow formats for the conversion tests: decoders
// that evaluate the fields in double, a nearest-even encoder over a table of every value, and a
// sweep over float bit patterns. Shared by the unit and the slow (exhaustive) tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels::testing {

// Independent decoders: sign, exponent and mantissa fields evaluated in double.
inline double decode_ieee(uint32_t bits, int exp_bits, int man_bits, bool has_inf) {
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const bool neg = (bits >> (man_bits + exp_bits)) & 1u;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t max_exp = (1u << exp_bits) - 1;
  double mag;
  if (has_inf && exp == max_exp) {
    mag = man == 0 ? INFINITY : NAN;
  } else if (!has_inf && exp == max_exp && man == (1u << man_bits) - 1) {
    mag = NAN;  // e4m3fn: only S.1111.111 is NaN
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits),
                     static_cast<int>(exp) - bias);
  }
  return neg ? -mag : mag;
}
inline double ref_f16(uint16_t h) { return decode_ieee(h, 5, 10, true); }
inline double ref_bf16(uint16_t h) { return decode_ieee(h, 8, 7, true); }
inline double ref_fp8(uint8_t v) { return decode_ieee(v, 4, 3, false); }

inline bool same_or_both_nan(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// Nearest-even reference encoder over a sorted table of a format's non-negative finite values.
class NearestEven {
 public:
  template <typename Decode>
  NearestEven(uint32_t codes, Decode decode, uint32_t sign_bit, double overflow_at,
              uint32_t overflow_code)
      : sign_bit_(sign_bit), overflow_at_(overflow_at), overflow_code_(overflow_code) {
    for (uint32_t c = 0; c < codes; ++c) {
      const double v = decode(c);
      if ((c & sign_bit) == 0 && std::isfinite(v)) table_.push_back({v, c});
    }
    std::sort(table_.begin(), table_.end());
  }
  // Code for finite or infinite x (not NaN).
  uint32_t encode(double x) const {
    const uint32_t sign = std::signbit(x) ? sign_bit_ : 0;
    const double a = std::fabs(x);
    if (a >= overflow_at_) return sign | overflow_code_;
    auto hi = std::lower_bound(table_.begin(), table_.end(), std::pair<double, uint32_t>{a, 0});
    if (hi == table_.end()) return sign | table_.back().second;
    if (hi->first == a || hi == table_.begin()) return sign | hi->second;
    const auto lo = hi - 1;
    const double dl = a - lo->first, dh = hi->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1u) == 0 ? lo->second : hi->second);
  }

 private:
  std::vector<std::pair<double, uint32_t>> table_;
  uint32_t sign_bit_;
  double overflow_at_;
  uint32_t overflow_code_;
};

inline const NearestEven& fp8_reference() {
  // e4m3fn saturates: everything at or above 448 (and infinity) is 448.
  static const NearestEven r(
      256, [](uint32_t c) { return ref_fp8(static_cast<uint8_t>(c)); }, 0x80, 448.0, 0x7E);
  return r;
}
inline const NearestEven& f16_reference() {
  static const NearestEven r(
      65536, [](uint32_t c) { return ref_f16(static_cast<uint16_t>(c)); }, 0x8000, 65520.0, 0x7C00);
  return r;
}
inline const NearestEven& bf16_reference() {
  // Halfway between the largest finite bf16 and 2^128 rounds to infinity.
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  static const NearestEven r(
      65536, [](uint32_t c) { return ref_bf16(static_cast<uint16_t>(c)); }, 0x8000, overflow,
      0x7F80);
  return r;
}

// Every float with bits i * stride (plus specials): ~1M values spread over all exponents.
template <typename Fn>
void sweep_floats(uint64_t stride, Fn&& fn) {
  for (uint64_t bits = 0; bits <= 0xFFFF'FFFFull; bits += stride) fn(static_cast<uint32_t>(bits));
  for (uint32_t bits : {0x0000'0000u, 0x8000'0000u, 0x7F80'0000u, 0xFF80'0000u, 0x7FC0'0000u,
                        0x0000'0001u, 0x7F7F'FFFFu, 0x43E0'0000u, 0x3C80'0000u, 0x3C7F'FFFFu}) {
    fn(bits);
  }
}

inline void check_encoders_against_reference(uint32_t bits) {
  const float f = std::bit_cast<float>(bits);
  if (std::isnan(f)) return;
  ASSERT_EQ(float_to_fp8e4m3(f), fp8_reference().encode(f)) << std::hex << bits;
  ASSERT_EQ(float_to_f16(f), f16_reference().encode(f)) << std::hex << bits;
  ASSERT_EQ(float_to_bf16(f), bf16_reference().encode(f)) << std::hex << bits;
}

}  // namespace kvtier::kernels::testing
