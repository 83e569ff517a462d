// CPU paged attention against the naive fp64 reference (paged_kv_fixture.hpp), for every ISA this
// CPU runs, every KV dtype, GQA group 1/4/8 and head_dim 64/128/256; plus one-token and 64k-token
// contexts, odd page counts, partial last pages, split-K merging, numerically hard inputs, the
// residency guard and input validation.
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (cpu::isa_kernels(isa) != nullptr) out.push_back(isa);
  }
  return out;
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
  expect_matches_reference(fx, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, DecodeSplitAlongKvMergesExactly) {
  PagedKvFixture fx(shape(), {129, 3, 250}, {}, 12);
  ASSERT_TRUE(cpu::decode_attention(fx.params(), options(/*min_split=*/16)).ok());
  expect_matches_reference(fx, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, ChunkedPrefillIsCausal) {
  // A whole prompt from scratch (chunk == length), a one-token chunk, and chunks against a cache.
  PagedKvFixture fx(shape(), {21, 37, 80, 5}, {21, 1, 17, 3}, 13);
  ASSERT_TRUE(cpu::prefill_attention(fx.params(), options()).ok());
  expect_matches_reference(fx, tolerance_for(shape().dtype));
}

TEST_P(AttentionMatrix, ChunkedPrefillSplitAlongKv) {
  PagedKvFixture fx(shape(), {100, 47}, {33, 47}, 14);
  ASSERT_TRUE(cpu::prefill_attention(fx.params(), options(/*min_split=*/16)).ok());
  expect_matches_reference(fx, tolerance_for(shape().dtype));
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  return std::string(cpu::isa_name(std::get<0>(info.param))) + "_" +
         std::string(dtype_name(std::get<1>(info.param))) + "_g" +
         std::to_string(std::get<2>(info.param)) + "_d" + std::to_string(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllIsasDtypesGroupsDims, AttentionMatrix,
    ::testing::Combine(::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
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
  expect_matches_reference(fx, tolerance_for(s.dtype));
}

TEST(AttentionLong, PrefillChunkAgainst64kCachedTokens) {
  KvShape s;
  s.kv_heads = 1;
  s.group = 8;
  s.head_dim = 64;
  s.dtype = Dtype::kFP8E4M3;
  PagedKvFixture fx(s, {65536 + 9}, {9}, 32);
  ASSERT_TRUE(cpu::prefill_attention(fx.params()).ok());
  expect_matches_reference(fx, tolerance_for(s.dtype));
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
    expect_matches_reference(fx, {2e-5, 2e-4}, 0.0f, s.value_scale);
  }
}

TEST(AttentionStability, ExplicitSoftmaxScale) {
  KvShape s;
  s.head_dim = 64;
  PagedKvFixture fx(s, {50}, {}, 42);
  AttentionParams p = fx.params();
  p.sm_scale = 0.3f;
  ASSERT_TRUE(cpu::decode_attention(p).ok());
  expect_matches_reference(fx, tolerance_for(s.dtype), 0.3f);
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
  std::vector<float> wide;
  {
    tbb::task_arena two(2);
    two.execute([&] { ASSERT_TRUE(cpu::decode_attention(batch.params()).ok()); });
    wide.assign(batch.out().begin(), batch.out().begin() + static_cast<long>(q_row));
  }
  tbb::task_arena one(1);
  one.execute([&] { ASSERT_TRUE(cpu::decode_attention(alone.params()).ok()); });
  EXPECT_EQ(0, std::memcmp(wide.data(), alone.out().data(), q_row * sizeof(float)))
      << "decode output changed with the batch or the thread count";
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
