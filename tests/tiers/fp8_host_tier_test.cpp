// tiers.host.kv_dtype: fp8_e4m3 — the host tier holds pages in fp8 with per-page scales. The
// HBM->host copy encodes each page (the bytes in the host frame are exactly the codec's), the
// link counts the encoded bytes, the NVMe tier stores and returns those bytes unchanged, and the
// host->HBM copy decodes within e4m3's bound. Runs on both copy engines: the host engine
// (emulated HBM) and the CUDA engine over the fake device. A page fp8 cannot hold fails its copy
// naming the HBM frame; a configuration that would widen fp8 pages again on NVMe is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/numeric_formats.hpp"
#include "tests/tiers/fp8_test_support.hpp"
#include "tests/tiers/tier_test_support.hpp"
#include "tiers/page_codec.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

TiersConfig fp8_host_config(const testing::TempDir& dir, const Geometry& g) {
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.host.capacity_bytes = 16 * FrameArena::frame_stride(PageFormat::fp8(g));
  c.host.kv_dtype = TierKvDtype::kFp8E4M3;
  c.nvme.paths = {dir.file("fp8.kvs")};
  c.nvme.capacity_bytes = 8 * (g.block_bytes() + g.layers * 4096 + 4096);
  c.nvme.queue_depth = 4;
  c.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  return c;
}

// The whole path of one block: HBM -> host (encoded) -> NVMe -> host (the same bytes) -> HBM
// (decoded within the bound), with the links counting encoded bytes.
void round_trip_block(TierStack& s, const Geometry& g) {
  const PageFormat f = PageFormat::fp8(g);
  ASSERT_TRUE(s.host->page_format() == f);
  EXPECT_EQ(s.host->page_bytes(), f.page_bytes());
  EXPECT_EQ(s.host->frame_bytes(), FrameArena::frame_stride(f));
  ASSERT_NE(s.nvme, nullptr);
  EXPECT_EQ(s.nvme_codec, nullptr);  // the host frames are already in the store's format
  EXPECT_EQ(s.nvme->geometry().dtype, Dtype::kFP8E4M3);

  const std::size_t page = g.page_bytes();
  const testing::Fp8Pages pages = testing::make_fp8_pages(g, g.layers, 500);
  const auto& orig = pages.wide;
  const auto& encoded = pages.encoded;
  std::vector<FramePair> out;
  std::vector<uint32_t> host_frames;
  for (uint32_t l = 0; l < g.layers; ++l) {
    std::memcpy(s.hbm->frame_address(l), orig[l].data(), page);
    host_frames.push_back(9 - 2 * l);  // scattered, descending
    out.push_back({l, host_frames.back()});
  }
  auto down = s.engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(down.ok()) << down.status().to_string();
  ASSERT_TRUE(down->wait().ok());
  EXPECT_EQ(s.stats->link(Link::kHbmToHost).bytes.load(), uint64_t{g.layers} * f.page_bytes());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_EQ(std::memcmp(s.host->frame_address(host_frames[l]), encoded[l].data(), f.page_bytes()),
              0)
        << "layer " << l << ": the host frame is not the codec's encoding";
  }

  const BlockKey key = testing::test_key(11);
  ASSERT_TRUE(s.engine->write_block(key, host_frames)->wait().ok());
  EXPECT_EQ(s.stats->link(Link::kHostToNvme).bytes.load(), f.block_bytes());
  testing::forget_memory_tiers(s, 16);
  const std::vector<uint32_t> back_frames = {12, 3, 14, 1};
  const std::vector<uint32_t> used(back_frames.begin(), back_frames.begin() + g.layers);
  ASSERT_TRUE(testing::read_block_into_hbm(s, key, used, 4).ok());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_EQ(std::memcmp(s.host->frame_address(used[l]), encoded[l].data(), f.page_bytes()), 0)
        << "layer " << l << ": NVMe did not return the stored bytes";
    EXPECT_TRUE(testing::within_fp8_bound(orig[l].data(), s.hbm->frame_address(4 + l), g))
        << "layer " << l;
  }
  EXPECT_EQ(s.stats->link(Link::kHostToHbm).bytes.load(), uint64_t{g.layers} * f.page_bytes());
  EXPECT_TRUE(s.nvme->audit().ok());
  EXPECT_EQ(s.stats->checksum_failures.load(), 0u);
}

// HBM frame 1 holds an inf: the copy fails naming it; the other pages are encoded.
void refuses_page_with_inf(TierStack& s, const Geometry& g) {
  const PageFormat f = PageFormat::fp8(g);
  std::vector<std::byte> orig(g.page_bytes());
  testing::fill_values(orig.data(), g, 42);
  std::vector<FramePair> out;
  for (uint32_t i = 0; i < 3; ++i) {
    std::memcpy(s.hbm->frame_address(i), orig.data(), orig.size());
    out.push_back({i, 6 + i});
  }
  kernels::store_from_float(s.hbm->frame_address(1), g.dtype, 5, INFINITY);
  auto t = s.engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(t.ok());
  const Status st = t->wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NaN or inf"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("HBM frame(s) 1)"), std::string::npos) << st.to_string();
  EXPECT_TRUE(encoded_page_refused(f, s.host->frame_address(7)));
  EXPECT_FALSE(encoded_page_refused(f, s.host->frame_address(6)));
  // A later copy on the same engine is unaffected.
  std::vector<FramePair> back = {{6, 10}};
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHostToHbm, back)->wait().ok());
  EXPECT_TRUE(testing::within_fp8_bound(orig.data(), s.hbm->frame_address(10), g));
}

class Fp8HostTier : public ::testing::TestWithParam<std::tuple<Dtype, testing::PageShape>> {};

TEST_P(Fp8HostTier, PagesAreEncodedOnTheWayDownAndStoredAsTheyAre) {
  const auto [dtype, shape] = GetParam();
  const Geometry g =
      testing::small_geometry(dtype, 3, shape.page_tokens, shape.kv_heads, shape.head_dim);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto opened = open_tiers(fp8_host_config(dir, g), g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_EQ((*opened)->engine->copy_engine_name(), "host-memcpy");
  round_trip_block(**opened, g);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8HostTier, testing::fp8_dtype_shape_params(),
                         testing::dtype_shape_name);

TEST(Fp8HostTierEngines, APageWithInfFailsItsCopyNamingTheFrame) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto opened = open_tiers(fp8_host_config(dir, g), g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  refuses_page_with_inf(**opened, g);
}

TEST(Fp8HostTierEngines, TheCudaEngineRunsTheCodecOnItsStreams) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 8, 128);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto device = std::make_shared<testing::FakeDevice>();
  TierStackOptions o;
  o.device = device;
  auto opened = open_tiers(fp8_host_config(dir, g), g, std::move(o));
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  ASSERT_EQ((*opened)->engine->copy_engine_name(), "cuda-streams");
  round_trip_block(**opened, g);
  EXPECT_EQ(device->codec_calls.load(), 2);  // one launch per copy, none per page
  EXPECT_EQ(device->copy_calls.load(), 0);   // nothing went through a plain copy
  refuses_page_with_inf(**opened, g);
}

TEST(Fp8HostTierEngines, WithAGpuTheHostPoolMustBeDriverPinned) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto device = std::make_shared<testing::FakeDevice>();
  device->refuse_pinned = true;  // the pool falls back to mmap: not mapped for the device
  TierStackOptions o;
  o.device = device;
  auto opened = open_tiers(fp8_host_config(dir, g), g, std::move(o));
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("tiers.host.kv_dtype"), std::string::npos)
      << opened.status().to_string();
}

TEST(Fp8HostTierCapacity, HoldsAboutTwiceThePagesOfTheSameCapacity) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 4, 16, 8, 128);  // 64 KiB pages
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = 4 * FrameArena::frame_stride(g);
  c.host.capacity_bytes = 64ull << 20;
  c.nvme.enabled = false;
  auto model = open_tiers(c, g);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  c.host.kv_dtype = TierKvDtype::kFp8E4M3;
  auto fp8 = open_tiers(c, g);
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  // A 32 KiB fp8 page and its 8 bytes of scales take a 36 KiB frame (4 KiB aligned, for O_DIRECT).
  EXPECT_EQ((*model)->host->frame_count(), 1024u);
  EXPECT_EQ((*fp8)->host->frame_count(), (64u << 20) / (36u << 10));
}

TEST(Fp8HostTierCapacity, AnNvmeTierInTheModelDtypeBelowAnFp8HostIsRefused) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  TiersConfig c = fp8_host_config(dir, g);
  c.nvme.kv_dtype = TierKvDtype::kModel;
  auto opened = open_tiers(c, g);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("tiers.nvme.kv_dtype"), std::string::npos)
      << opened.status().to_string();
}

TEST(Fp8HostTierCapacity, AModelAlreadyInFp8IsHeldAsComputed) {
  const Geometry g = testing::small_geometry(Dtype::kFP8E4M3, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto opened = open_tiers(fp8_host_config(dir, g), g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_FALSE((*opened)->host->page_format().encodes());
  EXPECT_EQ((*opened)->host->frame_bytes(), FrameArena::frame_stride(g));
}

}  // namespace
}  // namespace kvtier
