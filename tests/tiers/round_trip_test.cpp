// HBM -> host -> NVMe -> host -> HBM is bit-exact for every dtype and several page sizes,
// including pages that are not a multiple of the I/O alignment, through the tier stack a runtime
// opens (emulated HBM here; the CUDA path runs the same sequence in cuda_tier_test).
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

// Page bytes (bf16): 32 B, 600 B (not 512-aligned), 8 KiB, 64 KiB (the default model's page).
const testing::PageShape kShapes[] = {{1, 1, 8}, {3, 1, 50}, {16, 2, 64}, {16, 8, 128}};

class RoundTrip : public ::testing::TestWithParam<std::tuple<Dtype, testing::PageShape>> {};

TEST_P(RoundTrip, HbmHostNvmeHostHbmIsBitExact) {
  const auto [dtype, shape] = GetParam();
  const Geometry g =
      testing::small_geometry(dtype, 3, shape.page_tokens, shape.kv_heads, shape.head_dim);
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.host.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.nvme.paths = {dir.file("rt.kvs")};
  c.nvme.capacity_bytes = 4 * (g.block_bytes() + 3 * 4096 + 4096);
  c.nvme.queue_depth = 4;
  auto opened = open_tiers(c, g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  const std::size_t page = g.page_bytes();
  const BlockKey key = testing::test_key(42);

  // Three pages of one block in HBM frames 0..2.
  std::vector<FramePair> out;
  for (uint32_t l = 0; l < g.layers; ++l) {
    testing::fill_pattern(s.hbm->frame_address(l), page, 7000 + l);
    out.push_back({l, 5 + 2 * l});
  }
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
  std::vector<uint32_t> host_frames = {5, 7, 9};
  ASSERT_TRUE(s.engine->write_block(key, host_frames)->wait().ok());

  // Forget everything above NVMe.
  testing::forget_memory_tiers(s, 16);
  ASSERT_TRUE(testing::read_block_into_hbm(s, key, {12, 11, 10}, 8).ok());
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_TRUE(testing::matches_pattern(s.hbm->frame_address(8 + l), page, 7000 + l))
        << "layer " << l;
  }
  // One layer alone, as a layer-wise prefetch reads it.
  ASSERT_TRUE(s.engine->read_page(key, 1, 15)->wait().ok());
  EXPECT_TRUE(testing::matches_pattern(s.host->frame_address(15), page, 7001));

  EXPECT_TRUE(s.hbm->audit().ok());
  EXPECT_TRUE(s.host->audit().ok());
  EXPECT_TRUE(s.nvme->audit().ok());
  EXPECT_EQ(s.stats->checksum_failures.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndPageSizes, RoundTrip,
                         ::testing::Combine(::testing::ValuesIn(kAllDtypes),
                                            ::testing::ValuesIn(kShapes)),
                         testing::dtype_shape_name);

}  // namespace
}  // namespace kvtier
