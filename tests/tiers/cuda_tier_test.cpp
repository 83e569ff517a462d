// The CUDA tier on a real GPU: device HBM arena, pinned host pool, the stream copy engine and the
// full round trip through NVMe. Skips with the reason when no GPU is usable (label `gpu`).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/tiers/tier_test_support.hpp"
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

  std::unique_ptr<TierStack> open(const Geometry& g, const std::string& dir) {
    TiersConfig c;
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

}  // namespace
}  // namespace kvtier
