// Test helpers for pages that go through fp8 e4m3 (tiers.host.kv_dtype / tiers.nvme.kv_dtype):
// pages of realistic values, and the element-wise bound a round trip must stay within.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "kernels/numeric_formats.hpp"
#include "kvtier/types.hpp"
#include "tests/tiers/tier_test_support.hpp"
#include "tiers/page_codec.hpp"

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

// The dtypes quantized to fp8 and three page shapes (odd, small, the default model's), for
// INSTANTIATE_TEST_SUITE_P of tests over std::tuple<Dtype, PageShape>.
inline auto fp8_dtype_shape_params() {
  return ::testing::Combine(
      ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
      ::testing::Values(PageShape{3, 1, 50}, PageShape{16, 2, 64}, PageShape{16, 8, 128}));
}

// `count` pages of values (fill_values, seeds seed, seed + 1, ...) and their fp8 encodings as the
// CPU codec makes them: what an fp8 host frame must hold after the copy out of HBM.
struct Fp8Pages {
  std::vector<std::vector<std::byte>> wide;
  std::vector<std::vector<std::byte>> encoded;
};

inline Fp8Pages make_fp8_pages(const Geometry& g, uint32_t count, uint64_t seed) {
  const PageFormat f = PageFormat::fp8(g);
  Fp8Pages p;
  for (uint32_t i = 0; i < count; ++i) {
    p.wide.emplace_back(g.page_bytes());
    p.encoded.emplace_back(f.page_bytes());
    fill_values(p.wide.back().data(), g, seed + i);
    EXPECT_TRUE(encode_page(f, p.wide.back().data(), p.encoded.back().data()));
  }
  return p;
}

}  // namespace kvtier::testing
