// The CUDA tier on a real GPU: device HBM arena, pinned host pool, the stream copy engine and the
// full round trip through NVMe, and the fp8 host tier (the codec kernels on the copy streams, byte
// for byte the CPU codec). Skips with the reason when no GPU is usable (label `gpu`).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/numeric_formats.hpp"
#include "tests/tiers/fp8_test_support.hpp"
#include "tests/tiers/tier_test_support.hpp"
#include "tiers/page_codec.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

class CudaTier : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = open_cuda_device(0);
    if (!d.ok()) GTEST_SKIP() << "no GPU: " << d.status().message();
    device_ = std::move(d).value();
  }

  std::unique_ptr<TierStack> open(const Geometry& g, const std::string& dir,
                                  TierKvDtype below_hbm = TierKvDtype::kModel) {
    TiersConfig c;
    c.host.kv_dtype = below_hbm;
    c.nvme.kv_dtype = below_hbm;
    c.hbm.backend = HbmBackend::kCuda;
    c.hbm.capacity_bytes = 256 * FrameArena::frame_stride(g);
    c.host.capacity_bytes = 256 * FrameArena::frame_stride(g);
    c.nvme.enabled = !dir.empty();
    c.nvme.paths = {dir + "/cuda.kvs"};
    c.nvme.capacity_bytes = 8 * (g.block_bytes() + 64 * 4096);
    TierStackOptions o;
    o.device = device_;
    auto s = open_tiers(c, g, std::move(o));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Moves one page between host memory and an HBM frame outside the transfer engine.
  void device_copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
    auto stream = DeviceStream::create(device_);
    ASSERT_TRUE(stream.ok()) << stream.status().to_string();
    const CopySegment seg{dst, src, bytes};
    ASSERT_TRUE(device_->copy_async(std::span(&seg, 1), kind, stream->get()).ok());
    ASSERT_TRUE(device_->synchronize_stream(stream->get()).ok());
  }

  std::shared_ptr<DeviceApi> device_;
};

TEST_F(CudaTier, ArenasLiveOnTheDevice) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 4, 16, 8, 128);
  auto s = open(g, "");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->hbm->backend(), "cuda");
  EXPECT_TRUE(s->hbm->device_memory());
  EXPECT_EQ(s->host->backend(), "cuda_pinned");
  EXPECT_EQ(s->engine->copy_engine_name(), "cuda-streams");
  EXPECT_EQ(s->hbm->frame_count(), 256u);
}

TEST_F(CudaTier, HostDeviceHostIsBitExactForEveryDtype) {
  for (Dtype dtype : kAllDtypes) {
    const Geometry g = testing::small_geometry(dtype, 4, 16, 8, 128);
    auto s = open(g, "");
    ASSERT_NE(s, nullptr);
    const std::size_t page = g.page_bytes();
    std::vector<FramePair> in, out;
    for (uint32_t i = 0; i < 64; ++i) {
      testing::fill_pattern(s->host->frame_address(i), page, 40 + i);
      in.push_back({i, 255 - 3 * i});  // scattered on the device
      out.push_back({255 - 3 * i, 100 + i});
    }
    auto up = s->engine->copy(CopyDirection::kHostToHbm, in);
    ASSERT_TRUE(up.ok());
    EXPECT_NE(up->device_event(), nullptr);
    // No wait in between: the copy out depends on the copy in through the frame hazards.
    auto down = s->engine->copy(CopyDirection::kHbmToHost, out);
    ASSERT_TRUE(down.ok());
    ASSERT_TRUE(up->wait().ok());
    ASSERT_TRUE(down->wait().ok());
    for (uint32_t i = 0; i < 64; ++i) {
      EXPECT_TRUE(testing::matches_pattern(s->host->frame_address(100 + i), page, 40 + i))
          << dtype_name(dtype) << " page " << i;
    }
  }
}

TEST_F(CudaTier, FullRoundTripThroughNvme) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const Geometry g = testing::small_geometry(Dtype::kF16, 4, 16, 8, 128);
  auto s = open(g, dir.path());
  ASSERT_NE(s, nullptr);
  const std::size_t page = g.page_bytes();
  std::vector<FramePair> in, out;
  for (uint32_t l = 0; l < g.layers; ++l) {
    testing::fill_pattern(s->host->frame_address(l), page, 500 + l);
    in.push_back({l, 10 + l});
    out.push_back({10 + l, 20 + l});
  }
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHostToHbm, in)->wait().ok());
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
  std::vector<uint32_t> frames = {20, 21, 22, 23};
  ASSERT_TRUE(s->engine->write_block(testing::test_key(1), frames)->wait().ok());
  for (uint32_t f = 0; f < 64; ++f) std::memset(s->host->frame_address(f), 0, page);
  std::vector<uint32_t> back = {30, 31, 32, 33};
  ASSERT_TRUE(s->engine->read_block(testing::test_key(1), back)->wait().ok());
  std::vector<FramePair> up, down;
  for (uint32_t l = 0; l < g.layers; ++l) {
    up.push_back({30 + l, 40 + l});
    down.push_back({40 + l, 50 + l});
  }
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHostToHbm, up)->wait().ok());
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHbmToHost, down)->wait().ok());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_TRUE(testing::matches_pattern(s->host->frame_address(50 + l), page, 500 + l)) << l;
  }
}

TEST_F(CudaTier, Fp8HostTierEncodesOnTheGpuAsTheCpuCodecDoes) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::TempDir dir;
    ASSERT_TRUE(dir.ok());
    const Geometry g = testing::small_geometry(dtype, 3, 16, 8, 128);
    auto s = open(g, dir.path(), TierKvDtype::kFp8E4M3);
    ASSERT_NE(s, nullptr);
    const PageFormat f = PageFormat::fp8(g);
    ASSERT_TRUE(s->host->page_format() == f);
    const std::size_t page = g.page_bytes();
    const testing::Fp8Pages pages = testing::make_fp8_pages(g, g.layers, 700);
    const auto& orig = pages.wide;
    const auto& encoded = pages.encoded;
    std::vector<FramePair> out;
    std::vector<uint32_t> host_frames;
    for (uint32_t l = 0; l < g.layers; ++l) {
      device_copy(s->hbm->frame_address(l), orig[l].data(), page, CopyKind::kHostToDevice);
      host_frames.push_back(9 - 2 * l);
      out.push_back({l, host_frames.back()});
    }
    ASSERT_TRUE(s->engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
    for (uint32_t l = 0; l < g.layers; ++l) {
      EXPECT_EQ(
          std::memcmp(s->host->frame_address(host_frames[l]), encoded[l].data(), f.page_bytes()), 0)
          << "layer " << l;
    }
    ASSERT_TRUE(s->engine->write_block(testing::test_key(2), host_frames)->wait().ok());
    for (uint32_t fr = 0; fr < 16; ++fr) std::memset(s->host->frame_address(fr), 0, f.page_bytes());
    const std::vector<uint32_t> back = {20, 21, 22};
    ASSERT_TRUE(s->engine->read_block(testing::test_key(2), back)->wait().ok());
    std::vector<FramePair> up;
    for (uint32_t l = 0; l < g.layers; ++l) up.push_back({20 + l, 30 + l});
    ASSERT_TRUE(s->engine->copy(CopyDirection::kHostToHbm, up)->wait().ok());
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::vector<std::byte> got(page);
      device_copy(got.data(), s->hbm->frame_address(30 + l), page, CopyKind::kDeviceToHost);
      EXPECT_TRUE(testing::within_fp8_bound(orig[l].data(), got.data(), g)) << "layer " << l;
    }
    // A page holding inf fails its copy, naming the frame.
    std::vector<std::byte> bad = orig[0];
    kernels::store_from_float(bad.data(), g.dtype, 3, INFINITY);
    device_copy(s->hbm->frame_address(5), bad.data(), page, CopyKind::kHostToDevice);
    std::vector<FramePair> one = {{5, 40}};
    const Status st = s->engine->copy(CopyDirection::kHbmToHost, one)->wait();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("HBM frame(s) 5)"), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace kvtier
