// tiers.nvme.kv_dtype: fp8_e4m3 — blocks written to NVMe are quantized to fp8 with per-page scales
// and come back within e4m3's error bound, through the tier stack a runtime opens (HBM -> host ->
// NVMe -> host -> HBM, whole blocks and single layers); the NVMe links move and the store holds
// the fp8 bytes; pages fp8 cannot represent are refused whole; a store is never reopened in the
// other form.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/numeric_formats.hpp"
#include "tests/tiers/fp8_test_support.hpp"
#include "tests/tiers/tier_test_support.hpp"
#include "tiers/fault_injection.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

TiersConfig fp8_config(const testing::TempDir& dir, const Geometry& g, TierKvDtype kv_dtype) {
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.host.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.nvme.paths = {dir.file("fp8.kvs")};
  c.nvme.capacity_bytes = 8 * (g.block_bytes() + g.layers * 4096 + 4096);
  c.nvme.queue_depth = 4;
  c.nvme.kv_dtype = kv_dtype;
  return c;
}

class Fp8Offload : public ::testing::TestWithParam<std::tuple<Dtype, testing::PageShape>> {};

TEST_P(Fp8Offload, BlocksComeBackWithinTheFp8BoundAndMoveHalfTheBytes) {
  const auto [dtype, shape] = GetParam();
  const Geometry g =
      testing::small_geometry(dtype, 3, shape.page_tokens, shape.kv_heads, shape.head_dim);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto opened = open_tiers(fp8_config(dir, g, TierKvDtype::kFp8E4M3), g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  ASSERT_NE(s.nvme_codec, nullptr);
  const PageFormat f = PageFormat::fp8(g);
  EXPECT_EQ(s.nvme->geometry().dtype, Dtype::kFP8E4M3);
  EXPECT_EQ(s.nvme->layout().page_bytes, f.page_bytes());
  const std::size_t page = g.page_bytes();
  const BlockKey key = testing::test_key(7);

  std::vector<std::vector<std::byte>> orig(g.layers, std::vector<std::byte>(page));
  std::vector<FramePair> out;
  for (uint32_t l = 0; l < g.layers; ++l) {
    testing::fill_values(orig[l].data(), g, 100 + l);
    std::memcpy(s.hbm->frame_address(l), orig[l].data(), page);
    out.push_back({l, 4 + l});
  }
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
  std::vector<uint32_t> host_frames = {4, 5, 6};
  ASSERT_TRUE(s.engine->write_block(key, host_frames)->wait().ok());
  EXPECT_EQ(s.stats->link(Link::kHostToNvme).bytes.load(), f.block_bytes());

  testing::forget_memory_tiers(s, 16);
  ASSERT_TRUE(testing::read_block_into_hbm(s, key, {12, 10, 11}, 8).ok());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_TRUE(testing::within_fp8_bound(orig[l].data(), s.hbm->frame_address(8 + l), g))
        << "layer " << l;
  }
  // One layer alone, as a layer-wise prefetch reads it.
  ASSERT_TRUE(s.engine->read_page(key, 2, 15)->wait().ok());
  EXPECT_TRUE(testing::within_fp8_bound(orig[2].data(), s.host->frame_address(15), g));
  EXPECT_EQ(s.stats->link(Link::kNvmeToHost).bytes.load(), f.block_bytes() + f.page_bytes());
  EXPECT_TRUE(s.nvme->audit().ok());
  EXPECT_EQ(s.stats->checksum_failures.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8Offload, testing::fp8_dtype_shape_params(),
                         testing::dtype_shape_name);

TEST(Fp8OffloadStore, HoldsTwiceTheBlocksOfTheSameCapacity) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 4, 16, 8, 128);  // 64 KiB pages
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  TiersConfig c = fp8_config(dir, g, TierKvDtype::kModel);
  c.nvme.capacity_bytes = 64ull << 20;
  uint64_t model_blocks = 0;
  {
    auto s = open_tiers(c, g);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    model_blocks = (*s)->nvme->capacity_blocks();
  }
  c.nvme.paths = {dir.file("other.kvs")};
  c.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  auto s = open_tiers(c, g);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const uint64_t fp8_blocks = (*s)->nvme->capacity_blocks();
  // Each 32 KiB fp8 page carries 8 bytes of scales, so it takes 32.5 KiB at 512-byte alignment,
  // 36 KiB at 4 KiB (a 4 KiB-sector device, or a filesystem that reports no O_DIRECT alignment,
  // such as tmpfs, for which 4096 is assumed).
  const bool fine = (*s)->nvme->layout().io_align == 512;
  EXPECT_GE(fp8_blocks, model_blocks * (fine ? 19 : 17) / 10)
      << "alignment " << (*s)->nvme->layout().io_align;
  EXPECT_LE(fp8_blocks, model_blocks * 2);
  EXPECT_EQ((*s)->nvme_io()->capacity_blocks(), fp8_blocks);
}

TEST(Fp8OffloadStore, APageWithNanOrInfIsRefusedAndNothingIsWritten) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto opened = open_tiers(fp8_config(dir, g, TierKvDtype::kFp8E4M3), g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  for (uint32_t l = 0; l < g.layers; ++l) testing::fill_values(s.host->frame_address(l), g, l);
  kernels::store_from_float(s.host->frame_address(1), g.dtype, 77, INFINITY);
  std::vector<uint32_t> frames = {0, 1, 2};
  auto w = s.engine->write_block(testing::test_key(3), frames);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("layer 1"), std::string::npos) << w.status().to_string();
  EXPECT_NE(w.status().message().find("NaN or inf"), std::string::npos);
  EXPECT_FALSE(s.nvme->contains(testing::test_key(3)));
  EXPECT_EQ(s.nvme->used_blocks(), 0u);
  EXPECT_TRUE(s.nvme->audit().ok());
}

// A read the drive holds past tiers.nvme.io_timeout_ms: the drive only ever fills the staging, so
// the read is abandoned at its timeout whether or not its caller set on_buffers_released, and the
// caller's pages are released with its completion, untouched. The staging stays with the store
// until the drive answers; then the block reads back within the fp8 bound.
TEST(Fp8OffloadStore, AReadTheDriveHoldsCompletesAtItsTimeoutWithTheCallersPagesFree) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  TiersConfig c = fp8_config(dir, g, TierKvDtype::kFp8E4M3);
  c.nvme.io_timeout_ms = 300;
  auto faults = std::make_shared<FaultInjectingIoBackend>();
  TierStackOptions seams;
  seams.io = faults;
  auto opened = open_tiers(c, g, seams);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  std::vector<std::vector<std::byte>> orig(g.layers, std::vector<std::byte>(g.page_bytes()));
  for (uint32_t l = 0; l < g.layers; ++l) {
    testing::fill_values(orig[l].data(), g, 40 + l);
    std::memcpy(s.host->frame_address(l), orig[l].data(), g.page_bytes());
  }
  const BlockKey key = testing::test_key(5);
  std::vector<uint32_t> frames = {0, 1, 2};
  ASSERT_TRUE(s.engine->write_block(key, frames)->wait().ok());
  const std::vector<uint32_t> into = {4, 5, 6};
  const auto untouched = [&] {
    for (uint32_t f : into) {
      const auto* p = reinterpret_cast<const unsigned char*>(s.host->frame_address(f));
      if (std::any_of(p, p + g.page_bytes(), [](unsigned char b) { return b != 0x5a; })) {
        return false;
      }
    }
    return true;
  };
  for (uint32_t f : into) std::memset(s.host->frame_address(f), 0x5a, g.page_bytes());
  const auto unanswered = [&] { return s.stats->requests_unanswered.load(); };

  for (const bool caller_releases : {true, false}) {
    SCOPED_TRACE(caller_releases);
    faults->add_rule({IoOpcode::kRead, FaultKind::kHang, 1, 1});
    std::atomic<int> events{0};
    std::atomic<int> released_at{0};
    TransferOptions o;
    o.on_complete = [&](const Status&) { ++events; };
    if (caller_releases) o.on_buffers_released = [&](const Status&) { released_at = ++events; };
    auto t = s.engine->read_block(key, into, std::move(o));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(testing::eventually([&] { return t->done(); })) << "the read waits for the drive";
    EXPECT_EQ(t->wait().code(), StatusCode::kDeadlineExceeded) << t->wait().to_string();
    EXPECT_EQ(released_at.load(), caller_releases ? 2 : 0) << "released right after completing";
    EXPECT_EQ(unanswered(), 1u);
    EXPECT_TRUE(untouched());
    faults->answer_hung();
    ASSERT_TRUE(testing::eventually([&] { return unanswered() == 0; }));
    EXPECT_TRUE(untouched()) << "the drive's late answer reached the caller's pages";
  }
  ASSERT_TRUE(s.engine->read_block(key, into)->wait().ok());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_TRUE(testing::within_fp8_bound(orig[l].data(), s.host->frame_address(into[l]), g))
        << "layer " << l;
  }
  EXPECT_TRUE(s.nvme->audit().ok());
}

TEST(Fp8OffloadStore, AStoreIsNotReopenedInTheOtherForm) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 3, 16, 2, 64);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(open_tiers(fp8_config(dir, g, TierKvDtype::kFp8E4M3), g).ok());
  auto as_model = open_tiers(fp8_config(dir, g, TierKvDtype::kModel), g);
  ASSERT_FALSE(as_model.ok());
  EXPECT_EQ(as_model.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(as_model.status().message().find("fp8_e4m3"), std::string::npos)
      << as_model.status().to_string();
  // And it still opens as what it is.
  EXPECT_TRUE(open_tiers(fp8_config(dir, g, TierKvDtype::kFp8E4M3), g).ok());

  testing::TempDir other;
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(open_tiers(fp8_config(other, g, TierKvDtype::kModel), g).ok());
  auto as_fp8 = open_tiers(fp8_config(other, g, TierKvDtype::kFp8E4M3), g);
  ASSERT_FALSE(as_fp8.ok());
  EXPECT_EQ(as_fp8.status().code(), StatusCode::kFailedPrecondition);
}

TEST(Fp8OffloadStore, AModelAlreadyInFp8IsStoredAsComputed) {
  const Geometry g = testing::small_geometry(Dtype::kFP8E4M3, 3, 16, 2, 64);
  const PageFormat f = PageFormat::fp8(g);
  EXPECT_FALSE(f.encodes());
  EXPECT_EQ(f.page_bytes(), g.page_bytes());
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = open_tiers(fp8_config(dir, g, TierKvDtype::kFp8E4M3), g);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->nvme_codec, nullptr);
}

}  // namespace
}  // namespace kvtier
