// The scalar format conversions (kernels/numeric_formats.hpp) against independent definitions,
// exhaustively over every narrow pattern, with rounding at ties and saturation spelled out; and
// every SIMD variant's conversions against the scalar ones, bit for bit.
#include "kernels/numeric_formats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "tests/kernels/numeric_reference.hpp"

namespace kvtier::kernels {
namespace {

using namespace testing;  // NOLINT: the reference helpers

TEST(NumericFormats, F16DecodeAndRoundTripAll65536) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    ASSERT_TRUE(same_or_both_nan(f, ref_f16(static_cast<uint16_t>(h)))) << std::hex << h;
    const uint16_t back = float_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_to_float(back))) << std::hex << h;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u) << "NaN keeps its sign";
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(NumericFormats, Bf16DecodeAndRoundTripAll65536) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_TRUE(same_or_both_nan(f, ref_bf16(static_cast<uint16_t>(h)))) << std::hex << h;
    const uint16_t back = float_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(back))) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(NumericFormats, Fp8DecodeAndRoundTripAll256) {
  int nans = 0;
  for (uint32_t v = 0; v < 256; ++v) {
    const float f = fp8e4m3_to_float(static_cast<uint8_t>(v));
    ASSERT_TRUE(same_or_both_nan(f, ref_fp8(static_cast<uint8_t>(v)))) << std::hex << v;
    if (std::isnan(f)) {
      ++nans;
      EXPECT_EQ(float_to_fp8e4m3(f) & 0x7Fu, 0x7Fu);
      continue;
    }
    ASSERT_EQ(float_to_fp8e4m3(f), v) << std::hex << v;
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF
  EXPECT_EQ(fp8e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(0x01), 0x1p-9f);
}

TEST(NumericFormats, TiesRoundToEven) {
  // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1 (even); 1 + 3*2^-11 -> 1 + 2^-9.
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);      // half the smallest subnormal -> 0
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f), 0x0002);  // 1.5 subnormal steps -> 2
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // halfway to the next binade rounds to inf
  // bf16: 1 + 2^-8 -> 1; 1 + 3*2^-8 -> 1 + 2^-6.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(float_to_bf16(-(1.0f + 0x1p-8f)), 0xBF80);
  // fp8 e4m3: 1 + 1/16 -> 1 (0x38); 1 + 3/16 -> 1.25 (0x3A); subnormal ties too.
  EXPECT_EQ(float_to_fp8e4m3(1.0f + 1.0f / 16), 0x38);
  EXPECT_EQ(float_to_fp8e4m3(1.0f + 3.0f / 16), 0x3A);
  EXPECT_EQ(float_to_fp8e4m3(0.5f * 0x1p-9f), 0x00);
  EXPECT_EQ(float_to_fp8e4m3(1.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(float_to_fp8e4m3(2.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(float_to_fp8e4m3(7.5f * 0x1p-9f), 0x08);  // rounds up into the first normal
  EXPECT_EQ(float_to_fp8e4m3(-1.5f * 0x1p-9f), 0x82);
  // Saturation at 448 for every finite input and infinity; NaN stays NaN with its sign.
  EXPECT_EQ(float_to_fp8e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(464.0f), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_fp8e4m3(std::nanf("")), 0x7F);
  EXPECT_EQ(float_to_fp8e4m3(-std::nanf("")), 0xFF);
  EXPECT_EQ(float_to_fp8e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8e4m3(432.0f), 0x7E);  // halfway between 416 (0x7D) and 448: even is 0x7E
  EXPECT_EQ(float_to_fp8e4m3(431.0f), 0x7D);
}

TEST(NumericFormats, EncodersAreNearestEvenOnASweepOfFloats) {
  sweep_floats(4099, check_encoders_against_reference);
}

TEST(NumericFormats, Fp8EncoderAtEveryMidpoint) {
  // Midpoints between neighbouring fp8 values, and one float ulp either side of each.
  for (uint32_t c = 0; c < 0x7E; ++c) {
    const float lo = fp8e4m3_to_float(static_cast<uint8_t>(c));
    const float hi = fp8e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few mantissa bits
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ASSERT_EQ(float_to_fp8e4m3(x), fp8_reference().encode(x)) << x;
      ASSERT_EQ(float_to_fp8e4m3(-x), fp8_reference().encode(-x)) << -x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SIMD conversions equal the scalar ones
// ---------------------------------------------------------------------------------------------

class SimdConversions : public ::testing::TestWithParam<cpu::Isa> {
 protected:
  void SetUp() override {
    kernels_ = cpu::isa_kernels(GetParam());
    if (kernels_ == nullptr) GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(GetParam());
  }
  const cpu::IsaKernels* kernels_ = nullptr;
};

bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST_P(SimdConversions, WidenEveryPattern) {
  std::vector<uint16_t> all16(65536);
  for (uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536 + 3);
  for (Dtype d : {Dtype::kF16, Dtype::kBF16}) {
    // Odd count: exercises the tail path too.
    kernels_->to_f32(all16.data(), d, 1.0f, out.data(), 65535);
    for (uint32_t i = 0; i < 65535; ++i) {
      ASSERT_TRUE(same_bits_or_both_nan(out[i], load_as_float(all16.data(), d, i)))
          << dtype_name(d) << " " << std::hex << i;
    }
  }
  std::vector<uint8_t> all8(256);
  for (uint32_t i = 0; i < 256; ++i) all8[i] = static_cast<uint8_t>(i);
  kernels_->to_f32(all8.data(), Dtype::kFP8E4M3, 1.0f, out.data(), 256);
  for (uint32_t i = 0; i < 256; ++i) {
    ASSERT_TRUE(same_bits_or_both_nan(out[i], fp8e4m3_to_float(static_cast<uint8_t>(i))))
        << std::hex << i;
  }
  kernels_->to_f32(all8.data(), Dtype::kFP8E4M3, 0.25f, out.data(), 253);
  for (uint32_t i = 0; i < 253; ++i) {
    ASSERT_TRUE(same_bits_or_both_nan(out[i], fp8e4m3_to_float(static_cast<uint8_t>(i)) * 0.25f));
  }
}

TEST_P(SimdConversions, NarrowASweepOfFloats) {
  std::vector<float> in;
  sweep_floats(4099, [&](uint32_t bits) { in.push_back(std::bit_cast<float>(bits)); });
  in.push_back(std::nanf(""));
  const std::size_t n = in.size();  // not a multiple of the vector width
  std::vector<uint8_t> out(4 * n);
  for (Dtype d : kAllDtypes) {
    kernels_->from_f32(in.data(), 1.0f, d, out.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const float got = load_as_float(out.data(), d, i);
      std::vector<uint8_t> one(4);
      store_from_float(one.data(), d, 0, in[i]);
      const float want = load_as_float(one.data(), d, 0);
      ASSERT_TRUE(same_bits_or_both_nan(got, want))
          << dtype_name(d) << " input bits " << std::hex << std::bit_cast<uint32_t>(in[i]);
    }
  }
}

// convert (one pass, dtype to dtype) equals the scalar widen, multiply, narrow, for every pair of
// dtypes, at counts that end in each of its paths: 32 values per store (fp8), one vector, a
// zero-padded tail.
TEST_P(SimdConversions, ConvertEveryDtypePairAsTheScalarPath) {
  std::mt19937 rng(7);
  std::vector<float> values;
  for (int i = 0; i < 4000; ++i) {
    // Magnitudes from far below fp8's subnormals to beyond bf16's range, both signs.
    const float mag = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                                 std::uniform_int_distribution<int>(-30, 40)(rng));
    values.push_back((rng() & 1) != 0 ? -mag : mag);
  }
  for (float special :
       {0.0f, -0.0f, 448.0f, 464.0f, -480.0f, std::numeric_limits<float>::infinity(), std::nanf(""),
        std::ldexp(1.0f, -9), std::ldexp(1.5f, -10)}) {
    values[rng() % values.size()] = special;
  }
  for (Dtype from : kAllDtypes) {
    std::vector<uint8_t> src(values.size() * dtype_size(from));
    for (std::size_t i = 0; i < values.size(); ++i)
      store_from_float(src.data(), from, i, values[i]);
    for (Dtype to : kAllDtypes) {
      for (std::size_t n : {1u, 7u, 8u, 31u, 32u, 45u, 77u, 4000u}) {
        const float scale = n % 2 != 0 ? 0.37f : 1.0f;
        std::vector<uint8_t> got(n * dtype_size(to) + 1, 0xA5);
        kernels_->convert(src.data(), from, scale, got.data(), to, n);
        for (std::size_t i = 0; i < n; ++i) {
          uint8_t one[4];
          store_from_float(one, to, 0, load_as_float(src.data(), from, i) * scale);
          ASSERT_TRUE(
              same_bits_or_both_nan(load_as_float(got.data(), to, i), load_as_float(one, to, 0)))
              << dtype_name(from) << " -> " << dtype_name(to) << " n " << n << " element " << i;
        }
        ASSERT_EQ(got.back(), 0xA5) << "wrote past " << n << " elements";
      }
    }
  }
}

TEST_P(SimdConversions, AbsMaxIncludingNaN) {
  std::vector<float> v = {0.5f, -3.0f, 2.0f, 0.0f, -0.25f, 1.0f, 2.5f, -2.9f, 0.1f};
  EXPECT_EQ(kernels_->abs_max(v.data(), Dtype::kF32, v.size()), 3.0f);
  std::vector<uint16_t> h(37);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16(static_cast<float>(i) - 20.0f);
  EXPECT_EQ(kernels_->abs_max(h.data(), Dtype::kBF16, h.size()), 20.0f);
  v[6] = std::nanf("");  // in the first vector: must survive the later, NaN-free ones
  EXPECT_TRUE(std::isnan(kernels_->abs_max(v.data(), Dtype::kF32, v.size())));
  EXPECT_EQ(kernels_->abs_max(v.data(), Dtype::kF32, 0), 0.0f);
}

// abs_max of every dtype equals a scalar loop over the widened values, at counts with and without
// a partial last vector, with a NaN or an inf in the first, a middle or the last element.
TEST_P(SimdConversions, AbsMaxOfEveryDtypeAsTheScalarLoop) {
  std::mt19937 rng(11);
  for (Dtype d : kAllDtypes) {
    for (std::size_t n : {1u, 5u, 16u, 33u, 64u, 1000u}) {
      for (int special = 0; special < 7; ++special) {
        std::vector<float> values(n);
        for (float& v : values) {
          v = std::ldexp(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng),
                         std::uniform_int_distribution<int>(-12, 8)(rng));
        }
        // 0: none; 1-3: NaN first, middle, last; 4-6: -inf there.
        if (special != 0) {
          const std::size_t at = (special - 1) % 3 == 0   ? 0
                                 : (special - 1) % 3 == 1 ? n / 2
                                                          : n - 1;
          values[at] = special <= 3 ? std::nanf("") : -std::numeric_limits<float>::infinity();
        }
        std::vector<uint8_t> src(n * dtype_size(d));
        float want = 0.0f;
        for (std::size_t i = 0; i < n; ++i) {
          store_from_float(src.data(), d, i, values[i]);
          const float stored = std::fabs(load_as_float(src.data(), d, i));
          want = std::isnan(want) || std::isnan(stored) ? std::nanf("") : std::max(want, stored);
        }
        const float got = kernels_->abs_max(src.data(), d, n);
        ASSERT_TRUE(same_bits_or_both_nan(got, want))
            << dtype_name(d) << " n " << n << " case " << special << ": " << got << " vs " << want;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, SimdConversions,
                         ::testing::Values(cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512,
                                           cpu::Isa::kAvx512Bf16),
                         [](const ::testing::TestParamInfo<cpu::Isa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

}  // namespace
}  // namespace kvtier::kernels
