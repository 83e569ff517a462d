// CPU paged attention against the naive fp64 reference (paged_kv_fixture.hpp), for every ISA this
// CPU runs, every KV dtype, GQA group 1/4/8 and head_dim 64/128/256; plus one-token and 64k-token
// contexts, odd page counts, partial last pages, split-K merging, numerically hard inputs, the
// residency guard and input validation. The avx512_bf16 path for bf16 and fp8 KV is checked
// against the same reference within a bound derived from its roundings (see
// expect_within_bf16_dot_bound).
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "tests/kernels/paged_kv_fixture.hpp"

namespace kvtier::kernels {
namespace {

using cpu::CpuOptions;
using cpu::Isa;
using testing::KvShape;
using testing::PagedKvFixture;

// Tolerances, |got - ref| <= atol + rtol * |ref|, per KV dtype. The reference reads the very
// values stored in the pages, so these bound the kernel's f32 arithmetic (dot products of up to
// 256 terms, exp2 polynomial, split merges), not the storage format; fp8 adds the rounding of
// value * scale. Outputs are convex combinations of V values of magnitude ~1.
struct Tolerance {
  double atol;
  double rtol;
};
Tolerance tolerance_for(Dtype d) {
  switch (d) {
    case Dtype::kF32: return {2e-5, 1e-4};
    case Dtype::kF16: return {2e-5, 1e-4};
    case Dtype::kBF16: return {2e-5, 1e-4};
    case Dtype::kFP8E4M3: return {3e-5, 1e-4};
  }
  return {0, 0};
}

void expect_matches_reference(const PagedKvFixture& fx, Tolerance tol, float sm_scale = 0.0f,
                              double value_scale = 1.0) {
  std::vector<double> ref_out, ref_lse;
  fx.reference(ref_out, ref_lse, sm_scale);
  const auto& out = fx.out();
  ASSERT_EQ(out.size(), ref_out.size());
  std::size_t bad = 0;
  double worst = 0.0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(out[i] - ref_out[i]);
    const double allowed = tol.atol * value_scale + tol.rtol * std::fabs(ref_out[i]);
    if (!(err <= allowed)) ++bad;
    if (!(err <= worst)) {
      worst = err;
      worst_at = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "worst error " << worst << " at element " << worst_at << ": got "
                     << out[worst_at] << ", reference " << ref_out[worst_at];
  for (std::size_t i = 0; i < ref_lse.size(); ++i) {
    ASSERT_NEAR(fx.lse()[i], ref_lse[i], 1e-4 * std::max(1.0, std::fabs(ref_lse[i])))
        << "lse of row/head " << i;
  }
}

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (cpu::isa_kernels(isa) != nullptr) out.push_back(isa);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The bf16 dot-product path (avx512_bf16, bf16 KV) and its error bound
// ---------------------------------------------------------------------------------------------
//
// That path rounds two things the fp32 paths keep exact: q, once scaled into log2 units, to bf16
// (nearest even), and each softmax weight p_t to bf16, with l summed from the rounded weights.
// Both act on the weights only. Write the kernel's normalised weights as w~_t = w_t (1 + eta_t) /
// (1 + sum_j w_j eta_j), w the exact softmax; since sum_t w_t (v_t - o) = 0,
//   o~ - o = sum_t w_t eta_t (v_t - o) / (1 + sum_j w_j eta_j),
//   |o~_i - o_i| <= sum_t w_t |eta_t| |v_t,i - o_i| / (1 - max_t |eta_t|).
// Rounding q moves score t by exactly delta_t = ln2 sum_d q~_d k_t,d - scale sum_d q_d k_t,d
// (natural-log units), which the test computes from the stored values; rounding p_t scales it by
// (1 + e), |e| <= 2^-8 (bf16 keeps 8 significant bits, so its unit roundoff is 2^-8). Hence
//   |eta_t| <= exp(|delta_t|) (1 + 2^-8) - 1,
// and lse moves by ln(1 + sum_t w_t eta_t), at most -ln(1 - max_t |eta_t|). On top comes the
// fp32 arithmetic every path has (vdpbf16ps accumulates in fp32: products of two bf16 are exact,
// the additions round like an FMA chain's; it flushes denormals, below 2^-126, which values of
// magnitude ~1 never reach), bounded by the dtype's Tolerance as for the other paths.
// fp8 KV takes the same path: K and V are widened to bf16 exactly, the K scale multiplies the
// score in fp32, and the V scale goes into the weight before its rounding, with l summing each
// rounded weight divided by its scale: the kernel's weight is p_t (1 + e) times the scale, as
// the V sum sees it, and p_t (1 + e) as l sees it (up to one more f32 rounding, within the
// Tolerance), so the same bound holds over the dequantized values.

bool takes_bf16_dot(Isa isa, Dtype dtype) {
  if (isa == Isa::kAuto) isa = cpu::best_isa();
  return isa == Isa::kAvx512Bf16 && (dtype == Dtype::kBF16 || dtype == Dtype::kFP8E4M3);
}

void expect_within_bf16_dot_bound(const PagedKvFixture& fx, Tolerance tol, float sm_scale = 0.0f,
                                  double value_scale = 1.0) {
  const PagedKv& kv = fx.kv();
  const uint32_t dim = kv.head_dim;
  const uint32_t heads = fx.num_qo_heads();
  const uint32_t group = heads / kv.kv_heads;
  AttentionParams p;
  p.kv = kv;
  p.sm_scale = sm_scale;
  // The kernel's q scale (attention.cpp: f32 sm_scale times f32 log2(e)), and the reference's.
  const float q_scale = p.effective_sm_scale() * 1.4426950408889634f;
  const double scale = sm_scale != 0.0f ? sm_scale : 1.0 / std::sqrt(static_cast<double>(dim));
  const double ln2 = std::log(2.0);
  const double u = std::ldexp(1.0, -8);  // bf16 unit roundoff
  std::size_t bad = 0, checked = 0;
  double worst_ratio = 0.0, worst_bound = 0.0;
  std::vector<double> s, sr, w, eta, o;
  for (uint32_t b = 0; b < kv.batch; ++b) {
    const uint32_t pages = fx.indptr()[b + 1] - fx.indptr()[b];
    const uint32_t len = (pages - 1) * kv.page_tokens + fx.last_page_len()[b];
    const bool decode = fx.q_indptr().empty();
    const uint32_t chunk = decode ? 1 : fx.q_indptr()[b + 1] - fx.q_indptr()[b];
    const uint32_t row0 = decode ? b : fx.q_indptr()[b];
    for (uint32_t i = 0; i < chunk; ++i) {
      const uint32_t visible = len - chunk + i + 1;
      for (uint32_t h = 0; h < heads; ++h) {
        const uint32_t kvh = h / group;
        const std::size_t row = static_cast<std::size_t>(row0 + i) * heads + h;
        const float* q = fx.q().data() + row * dim;
        s.assign(visible, 0.0);
        sr.assign(visible, 0.0);
        double mx = -INFINITY;
        for (uint32_t j = 0; j < visible; ++j) {
          double exact = 0.0, rounded = 0.0;
          for (uint32_t d = 0; d < dim; ++d) {
            const double k = fx.kv_value(0, b, j, kvh, d);
            exact += static_cast<double>(q[d]) * k;
            rounded += static_cast<double>(bf16_to_float(float_to_bf16(q[d] * q_scale))) * k;
          }
          s[j] = exact * scale;
          sr[j] = rounded * ln2;
          mx = std::max(mx, s[j]);
        }
        w.assign(visible, 0.0);
        eta.assign(visible, 0.0);
        double sum = 0.0, eta_max = 0.0;
        for (uint32_t j = 0; j < visible; ++j) {
          w[j] = std::exp(s[j] - mx);
          sum += w[j];
          eta[j] = std::exp(std::fabs(sr[j] - s[j])) * (1.0 + u) - 1.0;
          eta_max = std::max(eta_max, eta[j]);
        }
        for (double& x : w) x /= sum;
        o.assign(dim, 0.0);
        for (uint32_t j = 0; j < visible; ++j) {
          for (uint32_t d = 0; d < dim; ++d) o[d] += w[j] * fx.kv_value(1, b, j, kvh, d);
        }
        std::vector<double> bound(dim, 0.0);
        for (uint32_t j = 0; j < visible; ++j) {
          for (uint32_t d = 0; d < dim; ++d) {
            bound[d] += w[j] * eta[j] * std::fabs(fx.kv_value(1, b, j, kvh, d) - o[d]);
          }
        }
        for (uint32_t d = 0; d < dim; ++d) {
          const double allowed =
              bound[d] / (1.0 - eta_max) + tol.atol * value_scale + tol.rtol * std::fabs(o[d]);
          const double err = std::fabs(fx.out()[row * dim + d] - o[d]);
          ++checked;
          if (!(err <= allowed)) {
            if (bad == 0) {
              ADD_FAILURE() << "row " << row << " dim " << d << ": got " << fx.out()[row * dim + d]
                            << ", reference " << o[d] << ", error " << err << " > bound "
                            << allowed;
            }
            ++bad;
          }
          worst_ratio = std::max(worst_ratio, err / allowed);
          worst_bound = std::max(worst_bound, allowed);
        }
        const double lse = mx + std::log(sum);
        const double lse_allowed = -std::log(1.0 - eta_max) + 1e-4 * std::max(1.0, std::fabs(lse));
        EXPECT_LE(std::fabs(fx.lse()[row] - lse), lse_allowed) << "lse of row/head " << row;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << checked << " elements";
  // How tight the bound is, for whoever changes the kernel or the bound.
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(worst_ratio));
  ::testing::Test::RecordProperty("largest_bound", std::to_string(worst_bound));
}

// The reference check that applies to `isa` (kAuto = the best this CPU runs) and dtype.
void expect_matches(const PagedKvFixture& fx, Isa isa, Dtype dtype, Tolerance tol,
                    float sm_scale = 0.0f, double value_scale = 1.0) {
  if (takes_bf16_dot(isa, dtype)) {
    expect_within_bf16_dot_bound(fx, tol, sm_scale, value_scale);
  } else {
    expect_matches_reference(fx, tol, sm_scale, value_scale);
  }
}

// ---------------------------------------------------------------------------------------------
// The conformance matrix
// ---------------------------------------------------------------------------------------------

using MatrixParam = std::tuple<Isa, Dtype, uint32_t /*group*/, uint32_t /*head_dim*/>;

class AttentionMatrix : public ::testing::TestWithParam<MatrixParam> {
 protected:
  void SetUp() override {
    if (cpu::isa_kernels(std::get<0>(GetParam())) == nullptr) {
      GTEST_SKIP() << "this CPU cannot run the " << cpu::isa_name(std::get<0>(GetParam()))
                   << " kernels";
    }
  }
  KvShape shape() const {
    KvShape s;
    s.dtype = std::get<1>(GetParam());
    s.group = std::get<2>(GetParam());
    s.head_dim = std::get<3>(GetParam());
    s.kv_heads = 2;
    s.frame_padding = 512;
    return s;
  }
  CpuOptions options(uint32_t min_split = 0) const {
    CpuOptions o;
    o.isa = std::get<0>(GetParam());
    o.min_split_tokens = min_split;
    return o;
  }
};

TEST_P(AttentionMatrix, DecodeOddPagesPartialLastPageAndOneToken) {
  // 1 token (one partial page), 37 (3 pages, last has 5), 80 (5 full pages), 129 (9 pages).
  PagedKvFixture fx(shape(), {1, 37, 80, 129}, {}, 11);
  ASSERT_TRUE(cpu::decode_attention(fx.params(), options()).ok());
  expect_matches(fx, options().isa, shape().dtype, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, DecodeSplitAlongKvMergesExactly) {
  PagedKvFixture fx(shape(), {129, 3, 250}, {}, 12);
  ASSERT_TRUE(cpu::decode_attention(fx.params(), options(/*min_split=*/16)).ok());
  expect_matches(fx, options().isa, shape().dtype, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, ChunkedPrefillIsCausal) {
  // A whole prompt from scratch (chunk == length), a one-token chunk, and chunks against a cache.
  PagedKvFixture fx(shape(), {21, 37, 80, 5}, {21, 1, 17, 3}, 13);
  ASSERT_TRUE(cpu::prefill_attention(fx.params(), options()).ok());
  expect_matches(fx, options().isa, shape().dtype, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, ChunkedPrefillSplitAlongKv) {
  PagedKvFixture fx(shape(), {100, 47}, {33, 47}, 14);
  ASSERT_TRUE(cpu::prefill_attention(fx.params(), options(/*min_split=*/16)).ok());
  expect_matches(fx, options().isa, shape().dtype, tolerance_for(shape().dtype));
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  return std::string(cpu::isa_name(std::get<0>(info.param))) + "_" +
         std::string(dtype_name(std::get<1>(info.param))) + "_g" +
         std::to_string(std::get<2>(info.param)) + "_d" + std::to_string(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllIsasDtypesGroupsDims, AttentionMatrix,
    ::testing::Combine(::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16),
                       ::testing::ValuesIn(kAllDtypes), ::testing::Values(1u, 4u, 8u),
                       ::testing::Values(64u, 128u, 256u)),
    matrix_name);

// ---------------------------------------------------------------------------------------------
// Storage precision: against the reference on the unrounded f32 values, the error is the format's
// ---------------------------------------------------------------------------------------------

TEST(AttentionPrecision, ErrorAgainstUnroundedValuesIsBoundedByTheStorageFormat) {
  // Same seed => same f32 draws; only the stored format differs. Bounds per dtype (outputs ~0.1):
  // f16 (11-bit mantissa) 2e-3, bf16 (8-bit) 2e-2, fp8 e4m3 with a per-page scale (4-bit) 1e-1.
  const std::vector<std::pair<Dtype, double>> bounds = {
      {Dtype::kF16, 2e-3}, {Dtype::kBF16, 2e-2}, {Dtype::kFP8E4M3, 1e-1}};
  KvShape base;
  base.head_dim = 128;
  base.group = 4;
  PagedKvFixture exact(base, {77, 200}, {}, 21);
  ASSERT_TRUE(cpu::decode_attention(exact.params()).ok());
  for (const auto& [dtype, bound] : bounds) {
    KvShape s = base;
    s.dtype = dtype;
    PagedKvFixture fx(s, {77, 200}, {}, 21);
    ASSERT_TRUE(cpu::decode_attention(fx.params()).ok());
    double worst = 0.0;
    for (std::size_t i = 0; i < fx.out().size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(fx.out()[i] - exact.out()[i])));
    }
    EXPECT_LT(worst, bound) << dtype_name(dtype);
    EXPECT_GT(worst, 0.0) << dtype_name(dtype) << " should differ from f32 at all";
  }
}

// ---------------------------------------------------------------------------------------------
// Long contexts, hard inputs, ISA agreement
// ---------------------------------------------------------------------------------------------

TEST(AttentionLong, Decode64kTokensAndAShortNeighbour) {
  KvShape s;
  s.kv_heads = 1;
  s.group = 4;
  s.head_dim = 128;
  s.dtype = Dtype::kBF16;
  PagedKvFixture fx(s, {65536 + 7, 3}, {}, 31);
  ASSERT_TRUE(cpu::decode_attention(fx.params()).ok());
  expect_matches(fx, Isa::kAuto, s.dtype, tolerance_for(s.dtype));
}

TEST(AttentionLong, PrefillChunkAgainst64kCachedTokens) {
  KvShape s;
  s.kv_heads = 1;
  s.group = 8;
  s.head_dim = 64;
  s.dtype = Dtype::kFP8E4M3;
  PagedKvFixture fx(s, {65536 + 9}, {9}, 32);
  ASSERT_TRUE(cpu::prefill_attention(fx.params()).ok());
  expect_matches(fx, Isa::kAuto, s.dtype, tolerance_for(s.dtype));
}

// Two KV heads of head_dim `dim`, `group` query heads each: decode over odd page counts (1..129
// tokens: whole and partial tiles), then chunked prefill over 1..7-token chunks (masked tiles),
// each checked against the reference by `check`. The head-dim tail tests' cases.
template <class Check>
void run_tail_cases(Isa isa, Dtype dtype, uint32_t dim, uint32_t group, uint32_t seed,
                    Check check) {
  SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(dtype_name(dtype)) +
               ", head_dim " + std::to_string(dim) + ", group " + std::to_string(group));
  KvShape s;
  s.dtype = dtype;
  s.head_dim = dim;
  s.group = group;
  s.kv_heads = 2;
  CpuOptions o;
  o.isa = isa;
  PagedKvFixture dec(s, {1, 2, 3, 17, 33, 129}, {}, seed);
  o.min_split_tokens = 0;
  ASSERT_TRUE(cpu::decode_attention(dec.params(), o).ok());
  check(dec);
  PagedKvFixture pre(s, {7, 40, 3}, {7, 5, 1}, seed + 10);
  o.min_split_tokens = 16;
  ASSERT_TRUE(cpu::prefill_attention(pre.params(), o).ok());
  check(pre);
}

TEST(AttentionExactPaths, HeadDimsWithA16ElementTailEveryDtype) {
  // The exact paths read bf16 K and V in split order (even, then odd elements of each
  // 2 x lane-width chunk; isa_core.inl bf16_split); a head_dim that is an odd multiple of 16
  // leaves AVX-512 a natural-order 16-element tail in both products and in q and o. Tiles of
  // 1..16 tokens and 1..7-token chunks take the whole-tile and the masked softmax both.
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (cpu::isa_kernels(isa) == nullptr) continue;
    for (Dtype dtype : kAllDtypes) {
      for (uint32_t dim : {16u, 48u, 80u, 144u, 208u}) {
        for (uint32_t group : {1u, 4u, 8u}) {
          run_tail_cases(isa, dtype, dim, group, 181 + dim + group, [&](const PagedKvFixture& fx) {
            expect_matches_reference(fx, tolerance_for(dtype));
          });
        }
      }
    }
  }
}

TEST(AttentionBf16Dot, HeadDimsWithA16ElementTailAndOddTokenCounts) {
  // head_dim an odd multiple of 16 takes the natural-order half-vector tail in both products;
  // odd token counts pair the last token with a zero row; chunks of 1..7 query tokens make
  // partial row blocks and causal masks inside a pair of tokens.
  if (cpu::isa_kernels(Isa::kAvx512Bf16) == nullptr) {
    GTEST_SKIP() << "this CPU cannot run the avx512_bf16 kernels";
  }
  for (Dtype dtype : {Dtype::kBF16, Dtype::kFP8E4M3}) {
    for (uint32_t dim : {16u, 48u, 80u, 144u, 208u}) {
      for (uint32_t group : {1u, 4u, 8u}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)));
        run_tail_cases(Isa::kAvx512Bf16, dtype, dim, group, 81 + dim + group,
                       [dtype](const PagedKvFixture& fx) {
                         expect_within_bf16_dot_bound(fx, tolerance_for(dtype));
                       });
      }
    }
  }
}

TEST(AttentionBf16Dot, RoundsQAndTheWeightsToBf16) {
  // The path must really be the bf16 one (not the exact fp32 path under another name): its
  // output differs from avx512's, by about what the bound allows and far more than fp32 noise.
  if (cpu::isa_kernels(Isa::kAvx512Bf16) == nullptr) {
    GTEST_SKIP() << "this CPU cannot run the avx512_bf16 kernels";
  }
  for (Dtype dtype : {Dtype::kBF16, Dtype::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvShape s;
    s.dtype = dtype;
    s.head_dim = 128;
    s.group = 4;
    PagedKvFixture dot(s, {300}, {}, 95);
    PagedKvFixture exact(s, {300}, {}, 95);
    CpuOptions o;
    o.isa = Isa::kAvx512Bf16;
    ASSERT_TRUE(cpu::decode_attention(dot.params(), o).ok());
    o.isa = Isa::kAvx512;
    ASSERT_TRUE(cpu::decode_attention(exact.params(), o).ok());
    double worst = 0.0;
    for (std::size_t i = 0; i < dot.out().size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(dot.out()[i] - exact.out()[i])));
    }
    EXPECT_GT(worst, 1e-4) << "no sign of the bf16 roundings";
    EXPECT_LT(worst, 1e-2);
  }
}

TEST(AttentionStability, LargeScoresDoNotOverflow) {
  // Scores reach hundreds (exp would overflow f32 without the running max), in every ISA.
  KvShape s;
  s.head_dim = 128;
  s.group = 4;
  s.query_scale = 20.0f;
  s.value_scale = 2.0f;
  for (Isa isa : runnable_isas()) {
    PagedKvFixture fx(s, {300, 17}, {}, 41);
    CpuOptions o;
    o.isa = isa;
    o.min_split_tokens = 32;
    ASSERT_TRUE(cpu::decode_attention(fx.params(), o).ok());
    for (float x : fx.out()) ASSERT_TRUE(std::isfinite(x)) << cpu::isa_name(isa);
    expect_matches(fx, isa, s.dtype, {2e-5, 2e-4}, 0.0f, s.value_scale);
  }
}

TEST(AttentionStability, Fp8NanCodesPoisonTheirOwnOutputsOnly) {
  // A NaN code (0x7F / 0xFF) in fp8 K makes every output of its KV head's query heads NaN; in V,
  // that dim of theirs. Everything else stays exact. The AVX2 and AVX-512 kernels convert
  // NaN-free rows without the NaN step, so this also checks that they find the rows that hold one
  // (the second shape's token rows are 80 bytes: the codes sit in the scan's 16-byte tail, past
  // AVX-512's one 64-byte block; the third's are 48, all of them AVX-512's masked tail). AVX-512
  // reads fp8 in split order (isa_core.inl fp8_split): the first shape's K code is at an odd
  // element, its V code at an even one, each in a whole 32-element chunk; the codes of the other
  // two shapes sit in the natural-order 16-element tail of their head_dim.
  struct Case {
    uint32_t kv_heads, group, head_dim;
  };
  for (const Case c : {Case{2, 4, 128}, Case{1, 8, 80}, Case{1, 4, 48}}) {
    KvShape s;
    s.dtype = Dtype::kFP8E4M3;
    s.kv_heads = c.kv_heads;
    s.group = c.group;
    s.head_dim = c.head_dim;
    const uint32_t k_head = c.kv_heads - 1, k_dim = c.head_dim - 3, v_dim = c.head_dim - 10;
    for (Isa isa : runnable_isas()) {
      for (uint32_t min_split : {0u, 32u}) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", head_dim " + std::to_string(c.head_dim) +
                     ", min split " + std::to_string(min_split));
        PagedKvFixture fx(s, {100, 70, 40}, {}, 43);
        fx.set_fp8_code(0, /*b=*/0, /*pos=*/37, k_head, k_dim, 0x7F);
        fx.set_fp8_code(1, /*b=*/1, /*pos=*/50, /*h=*/0, v_dim, 0xFF);
        CpuOptions o;
        o.isa = isa;
        o.min_split_tokens = min_split;
        ASSERT_TRUE(cpu::decode_attention(fx.params(), o).ok());
        std::vector<double> ref_out, ref_lse;
        fx.reference(ref_out, ref_lse);
        const uint32_t heads = fx.num_qo_heads();
        const Tolerance tol = tolerance_for(s.dtype);
        // The bf16 dot path (avx512_bf16) rounds q and the weights: its accuracy is checked
        // against its bound elsewhere; here only the poisoning is, so it gets room for that.
        const double dot_slack = takes_bf16_dot(isa, s.dtype) ? 1e-2 : 0.0;
        std::size_t nan_outputs = 0;
        for (uint32_t b = 0; b < 3; ++b) {
          for (uint32_t h = 0; h < heads; ++h) {
            for (uint32_t d = 0; d < c.head_dim; ++d) {
              const std::size_t i = (static_cast<std::size_t>(b) * heads + h) * c.head_dim + d;
              const bool poisoned =
                  (b == 0 && h / c.group == k_head) || (b == 1 && h / c.group == 0 && d == v_dim);
              ASSERT_EQ(std::isnan(ref_out[i]), poisoned) << "reference, sequence " << b;
              if (poisoned) {
                ASSERT_TRUE(std::isnan(fx.out()[i]))
                    << "sequence " << b << " head " << h << " dim " << d;
                ++nan_outputs;
              } else {
                ASSERT_NEAR(fx.out()[i], ref_out[i],
                            tol.atol + tol.rtol * std::fabs(ref_out[i]) + dot_slack)
                    << "sequence " << b << " head " << h << " dim " << d;
              }
            }
          }
        }
        EXPECT_EQ(nan_outputs, c.group * c.head_dim + c.group);
      }
    }
  }
}

TEST(AttentionStability, ExplicitSoftmaxScale) {
  KvShape s;
  s.head_dim = 64;
  PagedKvFixture fx(s, {50}, {}, 42);
  AttentionParams p = fx.params();
  p.sm_scale = 0.3f;
  ASSERT_TRUE(cpu::decode_attention(p).ok());
  expect_matches(fx, Isa::kAuto, s.dtype, tolerance_for(s.dtype), 0.3f);
}

TEST(AttentionConcurrency, IndependentCallsFromSeveralThreadsAgree) {
  KvShape s;
  s.head_dim = 128;
  s.group = 4;
  s.dtype = Dtype::kBF16;
  PagedKvFixture a(s, {500, 33, 64}, {}, 51);
  PagedKvFixture b(s, {500, 33, 64}, {}, 51);
  std::thread t1([&] { EXPECT_TRUE(cpu::decode_attention(a.params()).ok()); });
  std::thread t2([&] { EXPECT_TRUE(cpu::decode_attention(b.params()).ok()); });
  t1.join();
  t2.join();
  EXPECT_EQ(a.out(), b.out());
}

TEST(AttentionDeterminism, ResultsDoNotDependOnThreadsOrOnTheRestOfTheBatch) {
  // A sequence's output must be the same bit for bit whether it runs alone or beside others, on
  // one core or several: the split plan depends on its own length and the options only.
  KvShape s;
  s.head_dim = 64;
  s.group = 4;
  s.dtype = Dtype::kBF16;
  PagedKvFixture batch(s, {3000, 40, 2500}, {}, 61);
  PagedKvFixture alone(s, {3000}, {}, 61);
  // Same K/V and q for the first sequence in both: copy them over.
  const std::size_t q_row = static_cast<std::size_t>(alone.num_qo_heads()) * s.head_dim;
  std::copy(batch.q().begin(), batch.q().begin() + static_cast<long>(q_row),
            alone.mutable_q().begin());
  alone.copy_sequence_from(batch, 0, 0);
  for (Isa isa : runnable_isas()) {
    CpuOptions o;
    o.isa = isa;
    std::vector<float> wide;
    {
      tbb::task_arena two(2);
      two.execute([&] { ASSERT_TRUE(cpu::decode_attention(batch.params(), o).ok()); });
      wide.assign(batch.out().begin(), batch.out().begin() + static_cast<long>(q_row));
    }
    tbb::task_arena one(1);
    one.execute([&] { ASSERT_TRUE(cpu::decode_attention(alone.params(), o).ok()); });
    EXPECT_EQ(0, std::memcmp(wide.data(), alone.out().data(), q_row * sizeof(float)))
        << "decode output changed with the batch or the thread count (" << cpu::isa_name(isa)
        << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// Causal masking: a token a row must not see contributes nothing to it, whatever its K, V or scale
// ---------------------------------------------------------------------------------------------

TEST(AttentionCausalMask, NonFiniteKvOfMaskedTokensNeverReachEarlierRows) {
  // Sequence 0 (40 tokens, whole prompt): token 30's V is inf (fp8: a NaN code) and its K NaN, in
  // KV head 0. Rows 16..29 share token 30's tile with it (masked inside the tile), rows 0..15 see
  // nothing of that tile. Sequence 1 (70 tokens, chunk of 13): token 65 likewise; rows 0..7 of the
  // chunk must not see it (rows 0..5 see nothing of its tile, 6..7 part of it). Those rows must be
  // bit for bit those of the same call without the poison, and match the reference; rows that see
  // the token are non-finite in KV head 0's query heads.
  struct Poison {
    uint32_t seq, pos, clean_rows;
  };
  const Poison poisons[] = {{0, 30, 30}, {1, 65, 8}};
  const std::vector<uint32_t> lengths = {40, 70}, chunks = {40, 13};
  for (Isa isa : runnable_isas()) {
    for (Dtype dtype : kAllDtypes) {
      for (uint32_t group : {1u, 4u}) {
        for (uint32_t min_split : {0u, 16u}) {
          SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(dtype_name(dtype)) +
                       " group " + std::to_string(group) + " min split " +
                       std::to_string(min_split));
          KvShape s;
          s.dtype = dtype;
          s.group = group;
          s.head_dim = 64;
          PagedKvFixture clean(s, lengths, chunks, 44);
          PagedKvFixture fx(s, lengths, chunks, 44);
          const bool fp8 = dtype == Dtype::kFP8E4M3;
          for (const Poison& pz : poisons) {
            for (uint32_t d = 0; d < s.head_dim; ++d) {
              if (fp8) {
                fx.set_fp8_code(0, pz.seq, pz.pos, 0, d, 0x7F);
                fx.set_fp8_code(1, pz.seq, pz.pos, 0, d, 0xFF);
              } else {
                fx.set_value(0, pz.seq, pz.pos, 0, d, std::nanf(""));
                fx.set_value(1, pz.seq, pz.pos, 0, d, std::numeric_limits<float>::infinity());
              }
            }
          }
          CpuOptions o;
          o.isa = isa;
          o.min_split_tokens = min_split;
          ASSERT_TRUE(cpu::prefill_attention(clean.params(), o).ok());
          ASSERT_TRUE(cpu::prefill_attention(fx.params(), o).ok());
          std::vector<double> ref_out, ref_lse;
          fx.reference(ref_out, ref_lse);
          const uint32_t heads = fx.num_qo_heads();
          const Tolerance tol = tolerance_for(dtype);
          const bool exact_path = !takes_bf16_dot(isa, dtype);
          for (const Poison& pz : poisons) {
            const uint32_t chunk = chunks[pz.seq];
            for (uint32_t i = 0; i < chunk; ++i) {
              const std::size_t row = fx.q_indptr()[pz.seq] + i;
              for (uint32_t h = 0; h < heads; ++h) {
                const bool sees = i >= pz.clean_rows && h / group == 0;
                bool any_nonfinite = false;
                for (uint32_t d = 0; d < s.head_dim; ++d) {
                  const std::size_t e = (row * heads + h) * s.head_dim + d;
                  if (sees) {
                    any_nonfinite |= !std::isfinite(fx.out()[e]);
                    continue;
                  }
                  ASSERT_EQ(fx.out()[e], clean.out()[e])
                      << "sequence " << pz.seq << " chunk row " << i << " head " << h << " dim "
                      << d << " changed by a token it must not see";
                  if (exact_path) {
                    ASSERT_NEAR(fx.out()[e], ref_out[e],
                                tol.atol + tol.rtol * std::fabs(ref_out[e]))
                        << "sequence " << pz.seq << " chunk row " << i << " head " << h;
                  }
                }
                if (sees) {
                  EXPECT_TRUE(any_nonfinite)
                      << "sequence " << pz.seq << " chunk row " << i << " head " << h
                      << " sees the poisoned token but came out finite";
                } else {
                  ASSERT_EQ(fx.lse()[row * heads + h], clean.lse()[row * heads + h]);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(AttentionFp8Scales, ZeroScalePagesAreExactWhereTheMaskCutsThem) {
  // A zero scale (every value of that half is 0) on pages the causal mask cuts through: the mask
  // must not turn into -inf * 0 = NaN. Sequence 0's page 1 (tokens 16..31) has a zero K scale,
  // its page 2 (32..39) zero K and V scales; sequence 1's last page a zero V scale.
  KvShape s;
  s.dtype = Dtype::kFP8E4M3;
  s.group = 4;
  s.head_dim = 64;
  for (Isa isa : runnable_isas()) {
    for (uint32_t min_split : {0u, 16u}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " min split " + std::to_string(min_split));
      PagedKvFixture fx(s, {40, 37}, {40, 9}, 45);
      fx.scales()[2 * fx.frame_of(0, 16)] = 0.0f;
      fx.scales()[2 * fx.frame_of(0, 32)] = 0.0f;
      fx.scales()[2 * fx.frame_of(0, 32) + 1] = 0.0f;
      fx.scales()[2 * fx.frame_of(1, 36) + 1] = -0.0f;
      CpuOptions o;
      o.isa = isa;
      o.min_split_tokens = min_split;
      const Status st = cpu::prefill_attention(fx.params(), o);
      ASSERT_TRUE(st.ok()) << st.to_string();
      for (float x : fx.out()) ASSERT_TRUE(std::isfinite(x));
      expect_matches(fx, isa, s.dtype, tolerance_for(s.dtype));
    }
  }
}

TEST(AttentionFp8Scales, NegativeOrNonFiniteScalesOfListedFramesAreRejected) {
  KvShape s;
  s.dtype = Dtype::kFP8E4M3;
  PagedKvFixture fx(s, {40, 20}, {}, 46);
  const uint32_t frame = fx.indices()[3];
  for (float bad :
       {-0.5f, -std::numeric_limits<float>::denorm_min(), std::nanf(""),
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    for (int part = 0; part < 2; ++part) {
      SCOPED_TRACE("scale " + std::to_string(bad) + (part == 0 ? " (K)" : " (V)"));
      const float saved = fx.scales()[2 * frame + part];
      fx.scales()[2 * frame + part] = bad;
      const Status st = cpu::decode_attention(fx.params());
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find("frame " + std::to_string(frame)), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(part == 0 ? "k_scale" : "v_scale"), std::string::npos)
          << st.message();
      fx.scales()[2 * frame + part] = saved;
    }
  }
  for (float x : fx.out()) ASSERT_TRUE(std::isnan(x)) << "output written by a rejected call";
  // Frames the table does not list are not looked at; nor are scales of other dtypes.
  const std::set<uint32_t> listed(fx.indices().begin(), fx.indices().end());
  ASSERT_LT(listed.size(), fx.kv().num_frames) << "the fixture leaves spare frames";
  for (uint32_t f = 0; f < fx.kv().num_frames; ++f) {
    if (listed.count(f) == 0) fx.scales()[2 * f] = std::nanf("");
  }
  EXPECT_TRUE(cpu::decode_attention(fx.params()).ok());
  KvShape wide;
  PagedKvFixture f32(wide, {40}, {}, 47);
  std::vector<float> garbage(2 * f32.kv().num_frames, -std::numeric_limits<float>::infinity());
  AttentionParams p = f32.params();
  p.kv.scales = garbage.data();
  EXPECT_TRUE(cpu::decode_attention(p).ok());
}

// ---------------------------------------------------------------------------------------------
// Residency guard
// ---------------------------------------------------------------------------------------------

class SetResidency : public ResidencyCheck {
 public:
  explicit SetResidency(std::set<uint32_t> resident) : resident_(std::move(resident)) {}
  bool is_resident(uint32_t frame) const override { return resident_.count(frame) != 0; }

 private:
  std::set<uint32_t> resident_;
};

TEST(AttentionResidency, NonResidentFrameIsCaughtAndNothingIsWritten) {
  KvShape s;
  PagedKvFixture fx(s, {40, 20}, {}, 61);
  std::set<uint32_t> resident(fx.indices().begin(), fx.indices().end());
  const uint32_t missing = fx.indices()[2];
  resident.erase(missing);
  SetResidency check(resident);
  AttentionParams p = fx.params();
  p.residency.check = &check;
  p.residency.enabled = true;
  const Status st = cpu::decode_attention(p);
  ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("frame " + std::to_string(missing)), std::string::npos)
      << st.message();
  for (float x : fx.out()) ASSERT_TRUE(std::isnan(x)) << "output written despite the failure";

  // With every frame resident the same call runs; disabled, the check is not consulted.
  resident.insert(missing);
  SetResidency all(resident);
  p.residency.check = &all;
  EXPECT_TRUE(cpu::decode_attention(p).ok());
  p.residency.check = &check;
  p.residency.enabled = false;
  EXPECT_TRUE(cpu::decode_attention(p).ok());
}

TEST(AttentionResidency, PrefillChecksToo) {
  KvShape s;
  PagedKvFixture fx(s, {40}, {8}, 62);
  SetResidency none({});
  AttentionParams p = fx.params();
  p.residency.check = &none;
  p.residency.enabled = true;
  EXPECT_EQ(cpu::prefill_attention(p).code(), StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Bad input is a Status, never a crash
// ---------------------------------------------------------------------------------------------

TEST(AttentionValidation, RejectsBadShapesAndTables) {
  KvShape s;
  PagedKvFixture fx(s, {40, 20}, {}, 71);
  auto expect_code = [](const AttentionParams& p, StatusCode code, const char* what) {
    const Status st = cpu::decode_attention(p);
    EXPECT_EQ(st.code(), code) << what << ": " << st.to_string();
  };
  AttentionParams p = fx.params();
  p.kv.head_dim = 48 + 1;
  expect_code(p, StatusCode::kInvalidArgument, "head_dim not a multiple of 16");
  p = fx.params();
  p.kv.head_dim = 512;
  expect_code(p, StatusCode::kInvalidArgument, "head_dim above 256");
  p = fx.params();
  p.num_qo_heads = 3;
  expect_code(p, StatusCode::kInvalidArgument, "heads not a multiple of kv_heads");
  p = fx.params();
  p.kv.frame_stride = p.kv.page_bytes() - 1;
  expect_code(p, StatusCode::kInvalidArgument, "stride below page size");
  p = fx.params();
  p.kv.num_frames = 1;
  expect_code(p, StatusCode::kOutOfRange, "frame id beyond the arena");
  std::vector<uint32_t> lpl = fx.last_page_len();
  lpl[1] = 0;
  p = fx.params();
  p.kv.last_page_len = lpl.data();
  expect_code(p, StatusCode::kInvalidArgument, "empty last page");
  lpl[1] = s.page_tokens + 1;
  expect_code(p, StatusCode::kInvalidArgument, "overfull last page");
  std::vector<uint32_t> indptr = fx.indptr();
  indptr[1] = indptr[0];
  p = fx.params();
  p.kv.indptr = indptr.data();
  expect_code(p, StatusCode::kInvalidArgument, "sequence without pages");
  p = fx.params();
  p.q = nullptr;
  expect_code(p, StatusCode::kInvalidArgument, "null q");
  p = fx.params();
  p.q_indptr = fx.indptr().data();
  expect_code(p, StatusCode::kInvalidArgument, "decode with q_indptr");
  EXPECT_EQ(cpu::prefill_attention(fx.params()).code(), StatusCode::kInvalidArgument);
  for (float x : fx.out()) ASSERT_TRUE(std::isnan(x)) << "output written by a rejected call";
}

TEST(AttentionValidation, PrefillChunkLongerThanSequenceIsRejected) {
  KvShape s;
  PagedKvFixture fx(s, {10, 10}, {4, 4}, 72);
  std::vector<uint32_t> q_indptr = {0, 4, 15};  // 11 query tokens for a 10-token sequence
  AttentionParams p = fx.params();
  p.q_indptr = q_indptr.data();
  const Status st = cpu::prefill_attention(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.message();
}

// Shapes whose sizes overflow: validation reads only the table, never the arena, so none of these
// needs the memory it describes.
TEST(AttentionValidation, SequenceLengthsThatWrapOrExceedTheLimitAreRejected) {
  // 65536-token pages: 65537 pages hold 2^32 + 1 tokens, which wraps a uint32 length to 1.
  static uint8_t arena[64];
  PagedKv kv;
  kv.arena = arena;
  kv.num_frames = 1;
  kv.kv_heads = 1;
  kv.head_dim = 16;
  kv.dtype = Dtype::kFP8E4M3;
  kv.page_tokens = 65536;
  kv.frame_stride = kv.page_bytes();
  std::vector<uint32_t> indices(65537, 0);
  std::vector<uint32_t> indptr = {0, 65537};
  std::vector<uint32_t> last = {1};
  kv.batch = 1;
  kv.indptr = indptr.data();
  kv.indices = indices.data();
  kv.last_page_len = last.data();
  Status st = validate_paged_kv(kv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("sequence 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("4294967297"), std::string::npos) << st.message();
  // The limit itself is accepted, one token more is not.
  ASSERT_EQ(kMaxSequenceTokens % kv.page_tokens, 0u);
  indptr[1] = kMaxSequenceTokens / kv.page_tokens;
  last[0] = kv.page_tokens;
  EXPECT_TRUE(validate_paged_kv(kv).ok());
  indptr[1] += 1;
  last[0] = 1;
  st = validate_paged_kv(kv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("sequence 0"), std::string::npos) << st.message();
}

TEST(AttentionValidation, PageAndArenaSizesThatOverflowAreRejected) {
  static uint8_t arena[64];
  PagedKv kv;
  kv.arena = arena;
  kv.num_frames = 1;
  kv.dtype = Dtype::kF32;
  kv.head_dim = 256;
  kv.kv_heads = 1u << 31;
  kv.page_tokens = 1u << 31;  // 2 * 2^31 * 2^31 * 256 * 4 = 2^73 bytes: 0 in 64 bits
  kv.frame_stride = 4096;
  Status st = validate_kv_shape(kv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("page size overflows"), std::string::npos) << st.message();
  // A valid page, but num_frames * frame_stride beyond 64 bits: frame addresses would wrap.
  kv.kv_heads = 1;
  kv.page_tokens = 16;
  kv.frame_stride = uint64_t{1} << 62;
  kv.num_frames = 8;
  st = validate_kv_shape(kv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("address space"), std::string::npos) << st.message();
  kv.num_frames = 1;
  kv.frame_stride = kv.page_bytes();
  EXPECT_TRUE(validate_kv_shape(kv).ok());
}

TEST(AttentionValidation, EmptyBatchIsANoOp) {
  KvShape s;
  PagedKvFixture fx(s, {10}, {}, 73);
  AttentionParams p = fx.params();
  p.kv.batch = 0;
  EXPECT_TRUE(cpu::decode_attention(p).ok());
  EXPECT_TRUE(std::isnan(fx.out()[0]));
}

}  // namespace
}  // namespace kvtier::kernels
