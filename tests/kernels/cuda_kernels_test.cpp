// Every CUDA kernel against its CPU counterpart (itself checked against the fp64 reference in
// attention_test.cpp) on random shapes; skipped with a message where no GPU is present. The launch
// rejections (validation, residency, the default stream) happen on the host before any CUDA call,
// so those tests run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/frame_ops.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_support.hpp"
#include "kernels/cuda/frame_ops_cuda.hpp"
#include "tests/common/assert_ok.hpp"
#include "tests/kernels/paged_kv_fixture.hpp"

namespace kvtier::kernels {
namespace {

namespace kc = kernels::cuda;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status st = kc::gpu_available();
    if (!st.ok()) GTEST_SKIP() << "no usable GPU here: " << st.to_string();
    auto s = kc::CudaStream::create();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    stream_ = std::move(s).value();
  }

  template <typename T>
  kc::DeviceBuffer upload(const std::vector<T>& v) {
    auto buf = kc::DeviceBuffer::allocate(std::max<std::size_t>(1, v.size() * sizeof(T)));
    EXPECT_TRUE(buf.ok()) << buf.status().to_string();
    if (!buf.ok()) return {};
    if (!v.empty()) {
      const Status st =
          kc::copy_to_device(buf->get(), v.data(), v.size() * sizeof(T), stream_.get());
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    return std::move(buf).value();
  }

  template <typename T>
  std::vector<T> download(const kc::DeviceBuffer& buf, std::size_t n) {
    std::vector<T> v(n);
    const Status st = kc::copy_to_host(v.data(), buf.get(), n * sizeof(T), stream_.get());
    EXPECT_TRUE(st.ok()) << st.to_string();
    return v;
  }

  kc::CudaStream stream_;
};

// A fixture's KV, table and queries on the device.
struct DeviceAttention {
  kc::DeviceBuffer arena, scales, indptr, indices, last, q_indptr, q, out, lse;
  AttentionParams params;
};

class CudaAttention : public CudaTest {
 protected:
  DeviceAttention upload_fixture(testing::PagedKvFixture& fx) {
    DeviceAttention d;
    d.arena = upload(fx.arena());
    d.scales = upload(fx.scales());
    d.indptr = upload(fx.indptr());
    d.indices = upload(fx.indices());
    d.last = upload(fx.last_page_len());
    d.q = upload(fx.q());
    d.out = upload(std::vector<float>(fx.q().size(), 0.0f));
    d.lse = upload(std::vector<float>(fx.lse().size(), 0.0f));
    AttentionParams p = fx.params();
    p.kv.arena = d.arena.as<uint8_t>();
    p.kv.scales = p.kv.scales != nullptr ? d.scales.as<float>() : nullptr;
    p.kv.indptr = d.indptr.as<uint32_t>();
    p.kv.indices = d.indices.as<uint32_t>();
    p.kv.last_page_len = d.last.as<uint32_t>();
    if (p.q_indptr != nullptr) {
      d.q_indptr = upload(fx.q_indptr());
      p.q_indptr = d.q_indptr.as<uint32_t>();
    }
    p.q = d.q.as<float>();
    p.out = d.out.as<float>();
    p.lse = d.lse.as<float>();
    d.params = p;
    return d;
  }

  void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                    const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (!(err <= worst)) {
        worst = err;
        at = i;
      }
    }
    EXPECT_LE(worst, tol * (1.0 + std::fabs(want[at])))
        << what << ": element " << at << " got " << got[at] << " want " << want[at];
  }
};

struct Shape {
  Dtype dtype;
  uint32_t group;
  uint32_t head_dim;
};

std::vector<Shape> cuda_shapes() {
  std::vector<Shape> out;
  for (Dtype d : {Dtype::kF16, Dtype::kBF16, Dtype::kFP8E4M3}) {
    for (uint32_t g : {1u, 4u, 8u}) {
      for (uint32_t dim : {64u, 128u, 256u}) out.push_back({d, g, dim});
    }
  }
  return out;
}

// CUDA vs CPU agree to f32 rounding of differently ordered sums.
constexpr double kTolerance = 2e-5;

TEST_F(CudaAttention, DecodeMatchesCpuOnRandomShapes) {
  std::mt19937 rng(5);
  for (const Shape& s : cuda_shapes()) {
    testing::KvShape shape;
    shape.dtype = s.dtype;
    shape.group = s.group;
    shape.head_dim = s.head_dim;
    shape.kv_heads = 1 + rng() % 3;
    shape.page_tokens = (rng() % 2) ? 16 : 7;
    std::vector<uint32_t> lengths = {1, static_cast<uint32_t>(1 + rng() % 300),
                                     static_cast<uint32_t>(1 + rng() % 2000)};
    testing::PagedKvFixture fx(shape, lengths, {}, rng());
    ASSERT_TRUE(cpu::decode_attention(fx.params()).ok());
    const std::vector<float> cpu_out = fx.out();
    const std::vector<float> cpu_lse = fx.lse();
    DeviceAttention d = upload_fixture(fx);
    for (uint32_t splits : {1u, 3u, 17u}) {
      const std::size_t ws_bytes =
          kc::decode_workspace_bytes(fx.kv().batch, fx.num_qo_heads(), shape.head_dim, splits);
      auto ws = kc::DeviceBuffer::allocate(std::max<std::size_t>(ws_bytes, 1));
      ASSERT_TRUE(ws.ok());
      ASSERT_EQ(kc::launch_decode_attention(d.params, splits, ws->get(), ws_bytes, stream_.get()),
                cudaSuccess)
          << kc::last_launch_error();
      KVTIER_ASSERT_OK(stream_.synchronize());
      const std::string what = std::string(dtype_name(s.dtype)) + " g" + std::to_string(s.group) +
                               " d" + std::to_string(s.head_dim) + " splits " +
                               std::to_string(splits);
      expect_close(download<float>(d.out, cpu_out.size()), cpu_out, kTolerance, what);
      expect_close(download<float>(d.lse, cpu_lse.size()), cpu_lse, kTolerance, what + " lse");
    }
  }
}

TEST_F(CudaAttention, PrefillMatchesCpuOnRandomShapes) {
  std::mt19937 rng(6);
  for (const Shape& s : cuda_shapes()) {
    testing::KvShape shape;
    shape.dtype = s.dtype;
    shape.group = s.group;
    shape.head_dim = s.head_dim;
    shape.kv_heads = 1 + rng() % 2;
    const uint32_t l0 = 1 + rng() % 200, l1 = 1 + rng() % 600;
    const std::vector<uint32_t> chunks = {l0, static_cast<uint32_t>(1 + rng() % std::min(l1, 40u))};
    testing::PagedKvFixture fx(shape, {l0, l1}, chunks, rng());
    ASSERT_TRUE(cpu::prefill_attention(fx.params()).ok());
    const std::vector<float> cpu_out = fx.out();
    DeviceAttention d = upload_fixture(fx);
    const uint32_t max_chunk = *std::max_element(chunks.begin(), chunks.end());
    // The exact bound, then grids too short for the chunks (0 is taken as 1): every CTA loops
    // over the query blocks its grid left out, so each row is still computed. The output is
    // poisoned with NaN before each launch.
    for (uint32_t grid_tokens : {max_chunk, 1u, 0u}) {
      ASSERT_EQ(cudaMemsetAsync(d.out.get(), 0xFF, cpu_out.size() * sizeof(float), stream_.get()),
                cudaSuccess);
      ASSERT_EQ(kc::launch_prefill_attention(d.params, grid_tokens, stream_.get()), cudaSuccess)
          << kc::last_launch_error();
      KVTIER_ASSERT_OK(stream_.synchronize());
      expect_close(download<float>(d.out, cpu_out.size()), cpu_out, kTolerance,
                   std::string(dtype_name(s.dtype)) + " g" + std::to_string(s.group) + " d" +
                       std::to_string(s.head_dim) + " grid for " + std::to_string(grid_tokens) +
                       " tokens");
    }
  }
}

TEST_F(CudaAttention, DecodePropagatesNaNScoresLikeTheCpu) {
  // Sequence 0 has 2 tokens; token 1, its K NaN, is alone in its lane group's (or, with 3 splits,
  // its split's) first step. fmaxf keeps that step's max at -inf, and skipping the step on it
  // returned a finite output where the CPU returns NaN. Sequence 1: one NaN score among 300
  // tokens, in KV head 1; sequence 2 stays clean.
  for (Dtype dtype : {Dtype::kF16, Dtype::kBF16, Dtype::kFP8E4M3}) {
    testing::KvShape shape;
    shape.dtype = dtype;
    shape.group = 4;
    shape.head_dim = 128;
    shape.kv_heads = 2;
    testing::PagedKvFixture fx(shape, {2, 300, 50}, {}, 17);
    if (dtype == Dtype::kFP8E4M3) {
      fx.set_fp8_code(0, 0, 1, 0, 0, 0x7F);
      fx.set_fp8_code(0, 1, 150, 1, 5, 0xFF);
    } else {
      fx.set_value(0, 0, 1, 0, 0, std::nanf(""));
      fx.set_value(0, 1, 150, 1, 5, std::nanf(""));
    }
    ASSERT_TRUE(cpu::decode_attention(fx.params()).ok());
    const std::vector<float> cpu_out = fx.out();
    const std::vector<float> cpu_lse = fx.lse();
    DeviceAttention d = upload_fixture(fx);
    for (uint32_t splits : {1u, 3u}) {
      const std::string what = std::string(dtype_name(dtype)) + " splits " + std::to_string(splits);
      const std::size_t ws_bytes =
          kc::decode_workspace_bytes(fx.kv().batch, fx.num_qo_heads(), shape.head_dim, splits);
      auto ws = kc::DeviceBuffer::allocate(std::max<std::size_t>(ws_bytes, 1));
      ASSERT_TRUE(ws.ok());
      ASSERT_EQ(kc::launch_decode_attention(d.params, splits, ws->get(), ws_bytes, stream_.get()),
                cudaSuccess)
          << kc::last_launch_error();
      KVTIER_ASSERT_OK(stream_.synchronize());
      const std::vector<float> out = download<float>(d.out, cpu_out.size());
      const std::vector<float> lse = download<float>(d.lse, cpu_lse.size());
      std::size_t nan = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(std::isnan(out[i]), std::isnan(cpu_out[i])) << what << " element " << i;
        if (std::isnan(out[i])) {
          ++nan;
        } else {
          ASSERT_NEAR(out[i], cpu_out[i], kTolerance * (1.0 + std::fabs(cpu_out[i]))) << what;
        }
      }
      EXPECT_EQ(nan, 2u * shape.group * shape.head_dim) << what;
      for (std::size_t i = 0; i < lse.size(); ++i) {
        ASSERT_EQ(std::isnan(lse[i]), std::isnan(cpu_lse[i])) << what << " lse " << i;
      }
    }
  }
}

TEST_F(CudaAttention, MalformedDeviceTablesGiveNaNWithinTheSequencesPages) {
  // Tables the launcher cannot see (no host copies): the kernels must not read past a sequence's
  // pages. Decode: last_page_len 0 and page_tokens + 1 (which reached into sequence 2's pages);
  // both give NaN, sequence 2 its normal result.
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  shape.head_dim = 64;
  testing::PagedKvFixture fx(shape, {40, 20, 33}, {}, 18);
  ASSERT_TRUE(cpu::decode_attention(fx.params()).ok());
  const std::vector<float> cpu_out = fx.out();
  DeviceAttention d = upload_fixture(fx);
  d.params.residency.enabled = false;
  std::vector<uint32_t> last = fx.last_page_len();
  last[0] = 0;
  last[1] = shape.page_tokens + 1;
  kc::DeviceBuffer bad_last = upload(last);
  d.params.kv.last_page_len = bad_last.as<uint32_t>();
  const std::size_t row = static_cast<std::size_t>(fx.num_qo_heads()) * shape.head_dim;
  for (uint32_t splits : {1u, 3u}) {
    const std::size_t ws_bytes =
        kc::decode_workspace_bytes(fx.kv().batch, fx.num_qo_heads(), shape.head_dim, splits);
    auto ws = kc::DeviceBuffer::allocate(std::max<std::size_t>(ws_bytes, 1));
    ASSERT_TRUE(ws.ok());
    ASSERT_EQ(kc::launch_decode_attention(d.params, splits, ws->get(), ws_bytes, stream_.get()),
              cudaSuccess)
        << kc::last_launch_error();
    KVTIER_ASSERT_OK(stream_.synchronize());
    const std::vector<float> out = download<float>(d.out, cpu_out.size());
    const std::vector<float> lse = download<float>(d.lse, fx.lse().size());
    for (std::size_t i = 0; i < 2 * row; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
    for (uint32_t h = 0; h < 2 * fx.num_qo_heads(); ++h) ASSERT_TRUE(std::isnan(lse[h])) << h;
    for (std::size_t i = 2 * row; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], cpu_out[i], kTolerance * (1.0 + std::fabs(cpu_out[i]))) << i;
    }
  }

  // Prefill: sequence 1 has a chunk of 21 query tokens for 20 KV tokens (an underflowing visible
  // end read out of bounds): its rows are NaN, sequence 0's rows are the CPU's.
  testing::PagedKvFixture pre(shape, {40, 20}, {8, 21}, 19);
  const std::vector<uint32_t> fixed = {0, 8, 28};
  AttentionParams cp = pre.params();
  cp.q_indptr = fixed.data();
  ASSERT_TRUE(cpu::prefill_attention(cp).ok());
  const std::vector<float> cpu_pre = pre.out();
  DeviceAttention dp = upload_fixture(pre);
  dp.params.residency.enabled = false;
  ASSERT_EQ(kc::launch_prefill_attention(dp.params, 21, stream_.get()), cudaSuccess)
      << kc::last_launch_error();
  KVTIER_ASSERT_OK(stream_.synchronize());
  std::vector<float> out = download<float>(dp.out, cpu_pre.size());
  for (std::size_t i = 0; i < 8 * row; ++i) {
    ASSERT_NEAR(out[i], cpu_pre[i], kTolerance * (1.0 + std::fabs(cpu_pre[i]))) << i;
  }
  for (std::size_t i = 8 * row; i < out.size(); ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
  // A q_indptr that bounds no rows (decreasing, past q_indptr[batch]): nothing is written.
  kc::DeviceBuffer bad_q = upload(std::vector<uint32_t>{0, 8, 5});
  dp.params.q_indptr = bad_q.as<uint32_t>();
  ASSERT_EQ(cudaMemsetAsync(dp.out.get(), 0x7F, cpu_pre.size() * sizeof(float), stream_.get()),
            cudaSuccess);
  ASSERT_EQ(kc::launch_prefill_attention(dp.params, 21, stream_.get()), cudaSuccess)
      << kc::last_launch_error();
  KVTIER_ASSERT_OK(stream_.synchronize());
  out = download<float>(dp.out, cpu_pre.size());
  float marker;
  std::memset(&marker, 0x7F, sizeof marker);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], marker) << i;
}

TEST_F(CudaTest, GatherScatterMatchCpuAndRoundTrip) {
  const uint64_t stride = 70144, bytes = 65536;  // padded frames
  const uint32_t num_frames = 40, count = 23;
  std::vector<uint8_t> arena(stride * num_frames);
  std::mt19937 rng(8);
  for (auto& b : arena) b = static_cast<uint8_t>(rng());
  std::vector<uint32_t> frames(num_frames);
  std::iota(frames.begin(), frames.end(), 0u);
  std::shuffle(frames.begin(), frames.end(), rng);
  frames.resize(count);
  std::vector<uint8_t> cpu_staging(bytes * count);
  FrameCopyParams p{arena.data(),  stride, num_frames,        bytes,
                    frames.data(), count,  cpu_staging.data()};
  ASSERT_TRUE(cpu::gather_frames(p).ok());

  kc::DeviceBuffer d_arena = upload(arena), d_frames = upload(frames);
  kc::DeviceBuffer d_staging = upload(std::vector<uint8_t>(bytes * count, 0));
  FrameCopyParams dp{
      d_arena.as<uint8_t>(),  stride, num_frames, bytes, d_frames.as<uint32_t>(), count,
      d_staging.as<uint8_t>()};
  ASSERT_EQ(kc::launch_gather_frames(dp, stream_.get()), cudaSuccess);
  KVTIER_ASSERT_OK(stream_.synchronize());
  EXPECT_EQ(download<uint8_t>(d_staging, bytes * count), cpu_staging);

  // Wipe the frames on the device, scatter back: the arena is whole again.
  for (uint32_t f : frames) {
    ASSERT_EQ(cudaMemsetAsync(d_arena.as<uint8_t>() + f * stride, 0, bytes, stream_.get()),
              cudaSuccess);
  }
  ASSERT_EQ(kc::launch_scatter_frames(dp, stream_.get()), cudaSuccess);
  KVTIER_ASSERT_OK(stream_.synchronize());
  EXPECT_EQ(download<uint8_t>(d_arena, arena.size()), arena);
}

TEST_F(CudaTest, Fp8QuantizeAndDequantizeEqualTheCpuBytes) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
    Fp8FramesParams p;
    p.dtype = dtype;
    p.page_tokens = 16;
    p.kv_heads = 2;
    p.head_dim = 128;
    p.frame_stride = p.wide_page_bytes();
    p.num_frames = 9;
    std::vector<uint8_t> arena(p.frame_stride * p.num_frames);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (std::size_t i = 0; i < arena.size() / dtype_size(dtype); ++i) {
      store_from_float(arena.data(), dtype, i, normal(rng));
    }
    std::vector<uint32_t> frames = {4, 0, 8, 2, 7};
    p.count = static_cast<uint32_t>(frames.size());
    std::vector<uint8_t> staging(p.fp8_page_bytes() * p.count);
    std::vector<float> scales(2 * p.count);
    p.arena = arena.data();
    p.frames = frames.data();
    p.staging = staging.data();
    p.scales = scales.data();
    ASSERT_TRUE(cpu::quantize_frames_fp8(p).ok());

    kc::DeviceBuffer d_arena = upload(arena), d_frames = upload(frames);
    kc::DeviceBuffer d_staging = upload(std::vector<uint8_t>(staging.size(), 0));
    kc::DeviceBuffer d_scales = upload(std::vector<float>(scales.size(), 0.0f));
    Fp8FramesParams dp = p;
    dp.arena = d_arena.as<uint8_t>();
    dp.frames = d_frames.as<uint32_t>();
    dp.staging = d_staging.as<uint8_t>();
    dp.scales = d_scales.as<float>();
    ASSERT_EQ(kc::launch_quantize_frames_fp8(dp, stream_.get()), cudaSuccess);
    KVTIER_ASSERT_OK(stream_.synchronize());
    EXPECT_EQ(download<uint8_t>(d_staging, staging.size()), staging) << dtype_name(dtype);
    EXPECT_EQ(download<float>(d_scales, scales.size()), scales) << dtype_name(dtype);

    ASSERT_TRUE(cpu::dequantize_frames_fp8(p).ok());
    ASSERT_EQ(kc::launch_dequantize_frames_fp8(dp, stream_.get()), cudaSuccess);
    KVTIER_ASSERT_OK(stream_.synchronize());
    EXPECT_EQ(download<uint8_t>(d_arena, arena.size()), arena) << dtype_name(dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// Host-side rejections: no GPU needed, nothing is enqueued.
// ---------------------------------------------------------------------------------------------

class FrameSet : public ResidencyCheck {
 public:
  explicit FrameSet(std::set<uint32_t> frames) : frames_(std::move(frames)) {}
  bool is_resident(uint32_t frame) const override { return frames_.count(frame) != 0; }

 private:
  std::set<uint32_t> frames_;
};

// Any non-null value serves as a stream here: the launch is rejected before it is used.
cudaStream_t fake_stream() { return reinterpret_cast<cudaStream_t>(0x1); }

TEST(CudaLaunchRejections, NonResidentFrameIsNamedAndNothingLaunches) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40, 20}, {}, 3);
  std::set<uint32_t> resident(fx.indices().begin(), fx.indices().end());
  const uint32_t missing = fx.indices().back();
  resident.erase(missing);
  FrameSet check(resident);
  AttentionParams p = fx.params();
  p.residency.enabled = true;
  p.residency.check = &check;
  p.residency.host_indptr = fx.indptr().data();
  p.residency.host_indices = fx.indices().data();
  p.residency.host_last_page_len = fx.last_page_len().data();
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("frame " + std::to_string(missing)), std::string::npos)
      << kc::last_launch_error();
  // Prefill, one query token per sequence (q_indptr stands in for a device pointer).
  const std::vector<uint32_t> q_indptr = {0, 1, 2};
  AttentionParams pre = p;
  pre.q_indptr = q_indptr.data();
  pre.residency.host_q_indptr = q_indptr.data();
  EXPECT_EQ(kc::launch_prefill_attention(pre, 1, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("frame " + std::to_string(missing)), std::string::npos)
      << kc::last_launch_error();
  pre.residency.host_q_indptr = nullptr;
  EXPECT_EQ(kc::launch_prefill_attention(pre, 1, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("host_q_indptr"), std::string::npos)
      << kc::last_launch_error();
  p.residency.host_last_page_len = nullptr;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("host_last_page_len"), std::string::npos)
      << kc::last_launch_error();
  // Without the host copies the guard could check nothing: refused, not passed.
  p.residency.host_indices = nullptr;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("host_indices"), std::string::npos);
  p.residency.host_indptr = nullptr;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("host_indptr"), std::string::npos);
}

TEST(CudaLaunchRejections, ResidencyHostTableMustBeWholeAndInTheArena) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40, 20}, {}, 3);
  std::set<uint32_t> every_frame;
  for (uint32_t f = 0; f < fx.kv().num_frames + 8; ++f) every_frame.insert(f);
  FrameSet check(every_frame);
  AttentionParams p = fx.params();
  p.residency.enabled = true;
  p.residency.check = &check;
  std::vector<uint32_t> indptr = fx.indptr();
  std::vector<uint32_t> indices = fx.indices();
  p.residency.host_indptr = indptr.data();
  p.residency.host_indices = indices.data();
  p.residency.host_last_page_len = fx.last_page_len().data();
  // A sequence with no pages in the host copy would leave its frames unchecked.
  indptr[1] = indptr[0];
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("sequence 0 has no pages"), std::string::npos)
      << kc::last_launch_error();
  indptr = fx.indptr();
  p.residency.host_indptr = indptr.data();
  indices.back() = fx.kv().num_frames + 3;  // "resident" by the check, but outside the arena
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("names frame " + std::to_string(indices.back())),
            std::string::npos)
      << kc::last_launch_error();
}

// The host copies are validated as the CPU path validates its tables: what the residency check
// alone let through (last_page_len outside [1, page_tokens], a chunk longer than its sequence)
// would make the kernels read past a sequence's pages.
TEST(CudaLaunchRejections, HostTablesAreValidatedLikeTheCpuPath) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40, 20}, {8, 20}, 5);
  std::set<uint32_t> every_frame;
  for (uint32_t f = 0; f < fx.kv().num_frames; ++f) every_frame.insert(f);
  FrameSet check(every_frame);
  std::vector<uint32_t> last = fx.last_page_len();
  std::vector<uint32_t> q_indptr = fx.q_indptr();
  AttentionParams p = fx.params();
  p.residency.enabled = true;
  p.residency.check = &check;
  p.residency.host_indptr = fx.indptr().data();
  p.residency.host_indices = fx.indices().data();
  p.residency.host_last_page_len = last.data();
  p.residency.host_q_indptr = q_indptr.data();
  AttentionParams dec = p;
  dec.q_indptr = nullptr;
  const auto expect_rejected = [&](const std::string& what) {
    EXPECT_EQ(kc::launch_prefill_attention(p, 20, fake_stream()), cudaErrorInvalidValue) << what;
    EXPECT_NE(kc::last_launch_error().find(what), std::string::npos) << kc::last_launch_error();
    EXPECT_EQ(kc::launch_decode_attention(dec, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue)
        << what;
    EXPECT_NE(kc::last_launch_error().find(what), std::string::npos) << kc::last_launch_error();
  };
  last[1] = 0;
  expect_rejected("last_page_len of sequence 1 is 0");
  last[1] = shape.page_tokens + 1;
  expect_rejected("last_page_len of sequence 1 is 17");
  // Without a check, copies given whole are validated too.
  p.residency.check = nullptr;
  dec.residency.check = nullptr;
  expect_rejected("last_page_len of sequence 1 is 17");
  last = fx.last_page_len();
  p.residency.check = &check;
  q_indptr[2] = q_indptr[1] + 21;  // 21 query tokens for a 20-token sequence
  EXPECT_EQ(kc::launch_prefill_attention(p, 21, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("sequence 1 has a chunk of 21"), std::string::npos)
      << kc::last_launch_error();
}

TEST(CudaLaunchRejections, MisalignedAttentionArraysAreRefused) {
  testing::KvShape shape;
  shape.dtype = Dtype::kFP8E4M3;
  testing::PagedKvFixture fx(shape, {40, 20}, {8, 20}, 6);
  const auto off = [](const auto* ptr) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(ptr)>>;
    return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(ptr) + 2);
  };
  for (const char* name : {"q", "out", "lse", "kv.scales", "kv.indptr", "kv.indices",
                           "kv.last_page_len", "q_indptr"}) {
    AttentionParams p = fx.params();
    const std::string n = name;
    if (n == "q") p.q = off(p.q);
    if (n == "out") p.out = off(p.out);
    if (n == "lse") p.lse = off(p.lse);
    if (n == "kv.scales") p.kv.scales = off(p.kv.scales);
    if (n == "kv.indptr") p.kv.indptr = off(p.kv.indptr);
    if (n == "kv.indices") p.kv.indices = off(p.kv.indices);
    if (n == "kv.last_page_len") p.kv.last_page_len = off(p.kv.last_page_len);
    if (n == "q_indptr") p.q_indptr = off(p.q_indptr);
    EXPECT_EQ(kc::launch_prefill_attention(p, 20, fake_stream()), cudaErrorInvalidValue) << name;
    EXPECT_NE(kc::last_launch_error().find(n + " ("), std::string::npos) << kc::last_launch_error();
    EXPECT_NE(kc::last_launch_error().find("4-byte aligned"), std::string::npos)
        << kc::last_launch_error();
  }
  // Scales of other dtypes are not passed to the kernels, so not checked.
  testing::KvShape wide;
  wide.dtype = Dtype::kBF16;
  testing::PagedKvFixture bf16(wide, {40}, {}, 7);
  AttentionParams p = bf16.params();
  p.kv.scales = reinterpret_cast<const float*>(uintptr_t{3});
  p.sm_scale = std::numeric_limits<float>::quiet_NaN();  // rejected later, so nothing launches
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("sm_scale"), std::string::npos) << kc::last_launch_error();
}

TEST(CudaLaunchRejections, GridLimitsAreCheckedWithAClearMessage) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40}, {}, 8);
  // Only the launcher reads these fields (the tables are never read without host copies).
  AttentionParams p = fx.params();
  p.kv.batch = 65536;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("batch 65536"), std::string::npos)
      << kc::last_launch_error();
  EXPECT_NE(kc::last_launch_error().find("65535"), std::string::npos) << kc::last_launch_error();
  const std::vector<uint32_t> q_indptr = {0, 1};
  p.q_indptr = q_indptr.data();
  EXPECT_EQ(kc::launch_prefill_attention(p, 1, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("batch 65536"), std::string::npos)
      << kc::last_launch_error();
  p = fx.params();
  p.kv.kv_heads = 65536;
  p.num_qo_heads = 65536;
  p.kv.frame_stride = p.kv.page_bytes();
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("kv_heads 65536"), std::string::npos)
      << kc::last_launch_error();
  // Decode splits: the grid's x dimension, and batch x heads for the merge kernel.
  p = fx.params();
  EXPECT_EQ(kc::launch_decode_attention(p, 0x80000000u, nullptr, ~std::size_t{0}, fake_stream()),
            cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("grid's x limit"), std::string::npos)
      << kc::last_launch_error();
  p.kv.batch = 65535;
  p.kv.kv_heads = 8192;
  p.num_qo_heads = 8 * 8192;
  p.kv.frame_stride = p.kv.page_bytes();
  EXPECT_EQ(kc::launch_decode_attention(p, 2, nullptr, ~std::size_t{0}, fake_stream()),
            cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("grid's x limit"), std::string::npos)
      << kc::last_launch_error();
}

TEST(CudaLaunchRejections, PageSizesThatOverflowAreRefused) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40}, {}, 9);
  AttentionParams p = fx.params();
  p.kv.kv_heads = 1u << 31;
  p.kv.page_tokens = 1u << 31;  // 2^31 x 2^31 x 64 x 2 x 2 bytes: 2^70, 0 in 64 bits
  p.num_qo_heads = p.kv.kv_heads;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("page size overflows"), std::string::npos)
      << kc::last_launch_error();
}

TEST(CudaLaunchRejections, MisalignedFp8FramesAreRefusedBeforeAnyLaunch) {
  alignas(64) static uint8_t arena[2 * 4096 + 64];
  alignas(64) static uint8_t staging[4096];
  alignas(64) static float scales[4];
  const uint32_t frames[1] = {0};
  Fp8FramesParams p;
  p.dtype = Dtype::kF32;
  p.page_tokens = 2;
  p.kv_heads = 1;
  p.head_dim = 64;
  p.frame_stride = 4096;
  p.num_frames = 2;
  p.arena = arena;
  p.frames = frames;
  p.count = 1;
  p.staging = staging;
  p.scales = scales;
  p.frame_stride = 4096 + 2;  // not a multiple of 4 bytes
  EXPECT_EQ(kc::launch_quantize_frames_fp8(p, fake_stream()), cudaErrorInvalidValue);
  EXPECT_EQ(kc::launch_dequantize_frames_fp8(p, fake_stream()), cudaErrorInvalidValue);
  p.frame_stride = 4096;
  p.arena = arena + 2;
  EXPECT_EQ(kc::launch_quantize_frames_fp8(p, fake_stream()), cudaErrorInvalidValue);
  p.arena = arena;
  p.scales = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(scales) + 1);
  EXPECT_EQ(kc::launch_dequantize_frames_fp8(p, fake_stream()), cudaErrorInvalidValue);
}

TEST(CudaLaunchRejections, NonFiniteSmScale) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40}, {}, 4);
  AttentionParams p = fx.params();
  p.sm_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("sm_scale"), std::string::npos);
  p.sm_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(kc::launch_prefill_attention(p, 1, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("sm_scale"), std::string::npos);
}

TEST(CudaLaunchRejections, DefaultStreamShapesAndWorkspace) {
  testing::KvShape shape;
  shape.dtype = Dtype::kBF16;
  testing::PagedKvFixture fx(shape, {40}, {}, 4);
  AttentionParams p = fx.params();
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("stream"), std::string::npos);
  EXPECT_EQ(kc::launch_decode_attention(p, 4, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("workspace"), std::string::npos);
  p.kv.head_dim = 96;  // a multiple of 16 the CPU takes, not a CUDA kernel shape
  p.kv.frame_stride = 1 << 20;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(kc::last_launch_error().find("head_dim 96"), std::string::npos);
  p = fx.params();
  p.kv.dtype = Dtype::kF32;
  p.kv.frame_stride = 1 << 20;
  EXPECT_EQ(kc::launch_prefill_attention(p, 1, fake_stream()), cudaErrorInvalidValue);
  p = fx.params();
  p.num_qo_heads = 16 * shape.kv_heads;
  EXPECT_EQ(kc::launch_decode_attention(p, 1, nullptr, 0, fake_stream()), cudaErrorInvalidValue)
      << "a GQA group of 16 has no decode kernel";
  FrameCopyParams c;
  c.count = 1;
  EXPECT_EQ(kc::launch_gather_frames(c, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kc::launch_gather_frames(c, fake_stream()), cudaErrorInvalidValue);
}

TEST(CudaSupport, SplitsAndWorkspaceSizes) {
  EXPECT_EQ(kc::choose_decode_splits(256, 8, 132, 4096), 1u) << "the batch alone fills the GPU";
  EXPECT_EQ(kc::choose_decode_splits(1, 8, 132, 65536), 33u);
  EXPECT_EQ(kc::choose_decode_splits(1, 8, 132, 300), 1u) << "never below 256 tokens a split";
  EXPECT_EQ(kc::decode_workspace_bytes(2, 32, 128, 1), 0u);
  EXPECT_EQ(kc::decode_workspace_bytes(2, 32, 128, 4), 4u * 2 * 32 * 4 * 130);
}

TEST(CudaSupport, NoGpuErrorsAreUnavailable) {
  EXPECT_TRUE(kc::is_no_gpu_error(cudaErrorNoDevice));
  EXPECT_TRUE(kc::is_no_gpu_error(cudaErrorInsufficientDriver));
  EXPECT_FALSE(kc::is_no_gpu_error(cudaErrorMemoryAllocation));
  EXPECT_EQ(kc::cuda_status(cudaErrorNoDevice, "probe").code(), StatusCode::kUnavailable);
  EXPECT_EQ(kc::cuda_status(cudaErrorMemoryAllocation, "alloc").code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(kc::cuda_status(cudaSuccess, "x").ok());
}

}  // namespace
}  // namespace kvtier::kernels
