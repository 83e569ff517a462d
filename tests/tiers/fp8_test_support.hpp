// Test helpers for pages that go through fp8 e4m3 (tiers.host.kv_dtype / tiers.nvme.kv_dtype):
// pages of realistic values, and the element-wise bound a round trip must stay within.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>

#include "kernels/numeric_formats.hpp"
#include "kvtier/types.hpp"

namespace kvtier::testing {

// Values spread over several binades, a few zeros and tiny ones, in the page's dtype.
inline void fill_values(std::byte* page, const Geometry& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t n = g.page_bytes() / dtype_size(g.dtype);
  for (std::size_t i = 0; i < n; ++i) {
    float v = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 9) - 4));
    if (rng() % 53 == 0) v = 0.0f;
    if (rng() % 61 == 0) v *= 1e-6f;
    kernels::store_from_float(page, g.dtype, i, v);
  }
}

// Each half page (K, V) of `back` within e4m3's bound of `orig`: half an ulp of a 3-bit mantissa
// (2^-4 relative) for normals, half the subnormal step (2^-10 of the half's scale, amax / 448)
// below, plus one rounding back into the page's dtype.
inline ::testing::AssertionResult within_fp8_bound(const std::byte* orig, const std::byte* back,
                                                   const Geometry& g) {
  const PageFormat f = PageFormat::fp8(g);
  const std::size_t half = f.half_elems();
  const double wide_rel =
      g.dtype == Dtype::kF32 ? 0.0 : (g.dtype == Dtype::kF16 ? 0x1p-11 : 0x1p-8);
  for (std::size_t h = 0; h < 2; ++h) {
    double amax = 0;
    for (std::size_t i = 0; i < half; ++i) {
      amax = std::max<double>(amax, std::fabs(kernels::load_as_float(orig, g.dtype, h * half + i)));
    }
    const double scale = amax / 448.0;
    for (std::size_t i = 0; i < half; ++i) {
      const double x = kernels::load_as_float(orig, g.dtype, h * half + i);
      const double y = kernels::load_as_float(back, g.dtype, h * half + i);
      const double bound = (0x1p-4 + wide_rel) * std::fabs(x) + 0x1p-10 * scale * 1.0001;
      if (!(std::fabs(x - y) <= bound)) {
        return ::testing::AssertionFailure()
               << (h == 0 ? "K" : "V") << " element " << i << ": " << x << " came back as " << y
               << " (bound " << bound << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvtier::testing
