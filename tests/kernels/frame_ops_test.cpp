// Gather/scatter between frames and staging, and the fp8 page round trip, on the CPU.
#include "kernels/cpu/frame_ops.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/numeric_formats.hpp"
#include "tests/kernels/paged_kv_fixture.hpp"

namespace kvtier::kernels {
namespace {

std::vector<uint32_t> random_frames(uint32_t count, uint32_t num_frames, uint32_t seed) {
  std::vector<uint32_t> all(num_frames);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(count);
  return all;
}

std::vector<uint8_t> random_bytes(std::size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct CopyCase {
  uint64_t frame_bytes;
  uint64_t frame_stride;
  uint32_t num_frames;
  uint32_t count;
};

class FrameCopy : public ::testing::TestWithParam<CopyCase> {};

TEST_P(FrameCopy, GatherPacksFramesAndScatterRestoresThem) {
  const CopyCase c = GetParam();
  const std::vector<uint8_t> original = random_bytes(c.frame_stride * c.num_frames, 1);
  std::vector<uint8_t> arena = original;
  const std::vector<uint32_t> frames = random_frames(c.count, c.num_frames, 2);
  std::vector<uint8_t> staging(c.frame_bytes * c.count, 0);
  FrameCopyParams p{arena.data(),  c.frame_stride, c.num_frames,  c.frame_bytes,
                    frames.data(), c.count,        staging.data()};
  ASSERT_TRUE(cpu::gather_frames(p).ok());
  for (uint32_t i = 0; i < c.count; ++i) {
    ASSERT_EQ(0, std::memcmp(staging.data() + i * c.frame_bytes,
                             original.data() + frames[i] * c.frame_stride, c.frame_bytes))
        << "slot " << i << " frame " << frames[i];
  }
  // Wipe the gathered frames, scatter back: the arena is the original again (identity), and the
  // bytes between page end and frame stride were never touched.
  for (uint32_t f : frames) std::memset(arena.data() + f * c.frame_stride, 0, c.frame_bytes);
  ASSERT_TRUE(cpu::scatter_frames(p).ok());
  EXPECT_EQ(arena, original);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FrameCopy,
                         ::testing::Values(CopyCase{4096, 4096, 16, 7},  // small: one thread
                                           CopyCase{65536, 65536, 200,
                                                    150},               // ~10 MiB: parallel path
                                           CopyCase{1000, 1536, 9, 9},  // odd sizes, padded frames
                                           CopyCase{32768, 36864, 300, 1}));

TEST(FrameCopyValidation, RejectsBadIdsDuplicatesAndShapes) {
  std::vector<uint8_t> arena(8 * 512), staging(4 * 512);
  std::vector<uint32_t> frames = {1, 7, 3, 7};
  FrameCopyParams p{arena.data(), 512, 8, 512, frames.data(), 4, staging.data()};
  EXPECT_TRUE(cpu::gather_frames(p).ok()) << "a gather may read one frame twice";
  const Status dup = cpu::scatter_frames(p);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("frame 7"), std::string::npos) << dup.message();
  frames[1] = 8;
  const Status range = cpu::gather_frames(p);
  EXPECT_EQ(range.code(), StatusCode::kOutOfRange);
  EXPECT_NE(range.message().find("frame 8"), std::string::npos) << range.message();
  frames[1] = 2;
  p.frame_bytes = 1024;  // above the stride
  EXPECT_EQ(cpu::gather_frames(p).code(), StatusCode::kInvalidArgument);
  p.frame_bytes = 512;
  p.staging = nullptr;
  EXPECT_EQ(cpu::scatter_frames(p).code(), StatusCode::kInvalidArgument);
  p.count = 0;
  EXPECT_TRUE(cpu::scatter_frames(p).ok()) << "nothing to copy is not an error";
}

// ---------------------------------------------------------------------------------------------
// fp8
// ---------------------------------------------------------------------------------------------

struct Fp8Fixture {
  Fp8Fixture(Dtype dtype, uint32_t num_frames, uint32_t count, uint32_t seed) {
    p.dtype = dtype;
    p.page_tokens = 16;
    p.kv_heads = 2;
    p.head_dim = 64;
    p.frame_stride = p.wide_page_bytes() + 256;
    p.num_frames = num_frames;
    arena.assign(p.frame_stride * num_frames, 0);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::size_t half = p.half_elems();
    for (uint32_t f = 0; f < num_frames; ++f) {
      // K and V of each page on different scales, and one all-zero V half.
      const float k_mag = std::ldexp(1.0f, static_cast<int>(f % 7) - 3);
      const float v_mag = f == 2 ? 0.0f : 10.0f * k_mag;
      for (std::size_t i = 0; i < half; ++i) {
        store_from_float(arena.data() + f * p.frame_stride, dtype, i, normal(rng) * k_mag);
        store_from_float(arena.data() + f * p.frame_stride, dtype, half + i, normal(rng) * v_mag);
      }
    }
    original = arena;
    frames = random_frames(count, num_frames, seed + 1);
    if (std::find(frames.begin(), frames.end(), 2u) == frames.end()) frames[0] = 2;
    staging.assign(p.fp8_page_bytes() * count, 0);
    scales.assign(2 * count, 0.0f);
    p.arena = arena.data();
    p.frames = frames.data();
    p.count = count;
    p.staging = staging.data();
    p.scales = scales.data();
  }
  Fp8FramesParams p;
  std::vector<uint8_t> arena, original, staging;
  std::vector<uint32_t> frames;
  std::vector<float> scales;
};

class Fp8Frames : public ::testing::TestWithParam<std::tuple<cpu::Isa, Dtype>> {
 protected:
  void SetUp() override {
    if (cpu::isa_kernels(std::get<0>(GetParam())) == nullptr) {
      GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(std::get<0>(GetParam()));
    }
  }
};

TEST_P(Fp8Frames, RoundTripWithinTheFormatsErrorBound) {
  const auto [isa, dtype] = GetParam();
  Fp8Fixture fx(dtype, 12, 9, 5);
  ASSERT_TRUE(cpu::quantize_frames_fp8(fx.p, isa).ok());
  // Scales are amax / 448 per half; an all-zero half gets scale 1 and zero bytes.
  const std::size_t half = fx.p.half_elems();
  for (uint32_t i = 0; i < fx.p.count; ++i) {
    for (int part = 0; part < 2; ++part) {
      float amax = 0.0f;
      for (std::size_t e = 0; e < half; ++e) {
        amax = std::max(
            amax, std::fabs(load_as_float(fx.original.data() + fx.frames[i] * fx.p.frame_stride,
                                          dtype, part * half + e)));
      }
      const float want = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      ASSERT_EQ(fx.scales[2 * i + part], want) << "entry " << i << " part " << part;
      // The largest magnitude maps to +-448 exactly (0x7E / 0xFE).
      bool has_max = amax == 0.0f;
      for (std::size_t e = 0; e < half; ++e) {
        has_max |= (fx.staging[i * fx.p.fp8_page_bytes() + part * half + e] & 0x7F) == 0x7E;
      }
      EXPECT_TRUE(has_max) << "entry " << i << " part " << part;
    }
  }
  // Dequantize into a wiped arena and compare with the originals: per element
  // |x' - x| <= 2^-4 |x| (3 mantissa bits, nearest) + 2^-10 scale (subnormal step / 2),
  // plus the rounding of the wide format on the way back.
  for (uint32_t f : fx.frames)
    std::memset(fx.arena.data() + f * fx.p.frame_stride, 0, fx.p.wide_page_bytes());
  ASSERT_TRUE(cpu::dequantize_frames_fp8(fx.p, isa).ok());
  const double wide_eps =
      dtype == Dtype::kBF16 ? 0x1p-8 : (dtype == Dtype::kF16 ? 0x1p-11 : 0x1p-24);
  for (uint32_t i = 0; i < fx.p.count; ++i) {
    const uint8_t* got = fx.arena.data() + fx.frames[i] * fx.p.frame_stride;
    const uint8_t* want = fx.original.data() + fx.frames[i] * fx.p.frame_stride;
    for (std::size_t e = 0; e < 2 * half; ++e) {
      const double x = load_as_float(want, dtype, e);
      const double y = load_as_float(got, dtype, e);
      const double scale = fx.scales[2 * i + (e >= half)];
      const double bound = (0x1p-4 * std::fabs(x) + 0x1p-10 * scale) * (1 + wide_eps) +
                           wide_eps * std::fabs(x) + 1e-30;
      ASSERT_LE(std::fabs(y - x), bound)
          << "entry " << i << " element " << e << ": " << x << " -> " << y;
    }
  }
  // Bytes past the page in each frame were not touched.
  for (uint32_t f = 0; f < fx.p.num_frames; ++f) {
    ASSERT_EQ(
        0, std::memcmp(fx.arena.data() + f * fx.p.frame_stride + fx.p.wide_page_bytes(),
                       fx.original.data() + f * fx.p.frame_stride + fx.p.wide_page_bytes(), 256));
  }
}

TEST_P(Fp8Frames, EveryIsaProducesTheSameBytes) {
  const auto [isa, dtype] = GetParam();
  Fp8Fixture a(dtype, 10, 10, 7), b(dtype, 10, 10, 7);
  ASSERT_TRUE(cpu::quantize_frames_fp8(a.p, isa).ok());
  ASSERT_TRUE(cpu::quantize_frames_fp8(b.p, cpu::Isa::kScalar).ok());
  EXPECT_EQ(a.staging, b.staging);
  EXPECT_EQ(a.scales, b.scales);
}

INSTANTIATE_TEST_SUITE_P(
    IsasAndDtypes, Fp8Frames,
    ::testing::Combine(::testing::Values(cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512,
                                         cpu::Isa::kAvx512Bf16),
                       ::testing::Values(Dtype::kF32, Dtype::kF16, Dtype::kBF16)),
    [](const auto& info) {
      return std::string(cpu::isa_name(std::get<0>(info.param))) + "_" +
             std::string(dtype_name(std::get<1>(info.param)));
    });

TEST(Fp8FramesErrors, NonFiniteHalfIsReportedWithItsFrame) {
  Fp8Fixture fx(Dtype::kBF16, 6, 4, 9);
  const uint32_t bad = fx.frames[1];
  store_from_float(fx.arena.data() + bad * fx.p.frame_stride, Dtype::kBF16, fx.p.half_elems() + 5,
                   INFINITY);
  const Status st = cpu::quantize_frames_fp8(fx.p);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("frame " + std::to_string(bad)), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("V half"), std::string::npos) << st.message();
  EXPECT_TRUE(std::isnan(fx.scales[3]));
  EXPECT_FALSE(std::isnan(fx.scales[2])) << "the K half of that page is fine";
  EXPECT_FALSE(std::isnan(fx.scales[0]));
  // Dequantizing a NaN scale is refused rather than spreading NaN into frames.
  EXPECT_EQ(cpu::dequantize_frames_fp8(fx.p).code(), StatusCode::kInvalidArgument);
}

// A negative scale (the quantizer never writes one) is a corrupt entry: refused, naming it, and no
// frame is written.
TEST(Fp8FramesErrors, NegativeScaleIsRefusedAndNoFrameIsWritten) {
  Fp8Fixture fx(Dtype::kBF16, 6, 4, 9);
  ASSERT_TRUE(cpu::quantize_frames_fp8(fx.p).ok());
  const std::vector<uint8_t> before = fx.arena;
  fx.scales[3] = -0.5f;  // entry 1, V
  const Status st = cpu::dequantize_frames_fp8(fx.p);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("entry 1 (frame " + std::to_string(fx.frames[1]) + ") has V scale -"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(fx.arena, before) << "no frame may be written";
}

// A half whose largest value is below 448 / FLT_MAX (only f32 and bf16 reach that range) would
// overflow the inverse scale; it encodes as zeros (no NaN code), in every ISA alike.
TEST(Fp8FramesErrors, HalfOfTinyValuesEncodesAsZerosNotNan) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    Fp8Fixture fx(dtype, 4, 2, 11);
    const uint32_t tiny = fx.frames[0];
    uint8_t* page = fx.arena.data() + tiny * fx.p.frame_stride;
    const std::size_t half = fx.p.half_elems();
    for (std::size_t e = 0; e < half; ++e) {
      store_from_float(page, dtype, e, e % 3 == 0 ? 0.0f : (e % 2 == 0 ? 1e-37f : -3e-38f));
    }
    std::vector<uint8_t> first_bytes;
    std::vector<float> first_scales;
    for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
      if (cpu::isa_kernels(isa) == nullptr) continue;
      ASSERT_TRUE(cpu::quantize_frames_fp8(fx.p, isa).ok()) << dtype_name(dtype);
      for (std::size_t e = 0; e < half; ++e) {
        ASSERT_EQ(fx.staging[e] & 0x7F, 0) << dtype_name(dtype) << " element " << e;
      }
      EXPECT_EQ(fx.scales[0], 1.0f);
      EXPECT_GT(fx.scales[1], 0.0f) << "the V half is ordinary";
      if (first_bytes.empty()) {
        first_bytes = fx.staging;
        first_scales = fx.scales;
      }
      EXPECT_EQ(fx.staging, first_bytes) << cpu::isa_name(isa);
      EXPECT_EQ(fx.scales, first_scales) << cpu::isa_name(isa);
    }
    ASSERT_TRUE(cpu::dequantize_frames_fp8(fx.p).ok());
    for (std::size_t e = 0; e < half; ++e) {
      ASSERT_EQ(load_as_float(page, dtype, e), 0.0f) << dtype_name(dtype) << " element " << e;
    }
  }
}

TEST(Fp8FramesErrors, RejectsFp8AsTheWideFormat) {
  Fp8Fixture fx(Dtype::kBF16, 4, 2, 3);
  fx.p.dtype = Dtype::kFP8E4M3;
  EXPECT_EQ(cpu::quantize_frames_fp8(fx.p).code(), StatusCode::kInvalidArgument);
}

// Attention over fp8 pages made by the quantizer equals attention over the dequantized pages:
// the kernels read fp8 * scale exactly as dequantize writes it (f32 frames keep it exact).
TEST(Fp8Frames, AttentionOverQuantizedPagesMatchesDequantizedPages) {
  testing::KvShape s;
  s.dtype = Dtype::kF32;
  s.head_dim = 64;
  s.group = 4;
  testing::PagedKvFixture wide(s, {70, 33}, {}, 81);
  s.dtype = Dtype::kFP8E4M3;
  testing::PagedKvFixture narrow(s, {70, 33}, {}, 81);  // same table; pages replaced below

  const uint32_t frames_n = wide.kv().num_frames;
  std::vector<uint32_t> all(frames_n);
  std::iota(all.begin(), all.end(), 0u);
  Fp8FramesParams q;
  q.arena = wide.arena().data();
  q.frame_stride = wide.kv().frame_stride;
  q.num_frames = frames_n;
  q.dtype = Dtype::kF32;
  q.page_tokens = s.page_tokens;
  q.kv_heads = s.kv_heads;
  q.head_dim = s.head_dim;
  q.frames = all.data();
  q.count = frames_n;
  std::vector<uint8_t> packed(q.fp8_page_bytes() * frames_n);
  q.staging = packed.data();
  q.scales = narrow.scales().data();  // frame i's scales at [2i, 2i+1]: same indexing
  ASSERT_TRUE(cpu::quantize_frames_fp8(q).ok());
  for (uint32_t f = 0; f < frames_n; ++f) {
    std::memcpy(narrow.arena().data() + f * narrow.kv().frame_stride,
                packed.data() + f * q.fp8_page_bytes(), q.fp8_page_bytes());
  }
  ASSERT_TRUE(cpu::dequantize_frames_fp8(q).ok());  // wide now holds the dequantized values
  ASSERT_EQ(wide.indices(), narrow.indices());
  ASSERT_TRUE(cpu::decode_attention(wide.params()).ok());
  ASSERT_TRUE(cpu::decode_attention(narrow.params()).ok());
  for (std::size_t i = 0; i < wide.out().size(); ++i) {
    ASSERT_NEAR(wide.out()[i], narrow.out()[i], 1e-5) << i;
  }
}

}  // namespace
}  // namespace kvtier::kernels
