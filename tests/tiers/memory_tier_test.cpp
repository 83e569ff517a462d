// The HBM arena and the host pool: frame layout, backend choice, and degradation when the system
// refuses huge pages, mlock, pinned memory or the full capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/hbm_arena.hpp"
#include "tiers/host_pool.hpp"

namespace kvtier {
namespace {

const Geometry kGeom = testing::small_geometry(Dtype::kFP8E4M3, 4, 16, 2, 40);  // 2560-byte pages

TEST(FrameArena, FramesAreAlignedAndStrideIsRoundedUp) {
  EXPECT_EQ(FrameArena::frame_stride(kGeom), 4096u);
  HbmTierConfig c;
  c.backend = HbmBackend::kEmulated;
  c.capacity_bytes = 10 * 4096 + 100;
  auto a = HbmArena::create(c, kGeom, nullptr);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ((*a)->frame_count(), 10u);
  EXPECT_EQ((*a)->backend(), "emulated");
  EXPECT_FALSE((*a)->device_memory());
  EXPECT_EQ((*a)->tier(), Tier::kHbm);
  for (uint32_t f = 0; f < 10; ++f) {
    std::byte* p = (*a)->frame_address(f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
    auto back = (*a)->frame_of(p + 100);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
  }
  EXPECT_EQ((*a)->checked_frame_address(10).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*a)->capacity_bytes(), 10u * 4096);
}

TEST(FrameArena, ZeroCapacityIsADisabledTier) {
  HostTierConfig c;
  c.capacity_bytes = 0;
  auto p = HostPool::create(c, kGeom, nullptr);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->frame_count(), 0u);
  EXPECT_EQ((*p)->allocator().allocate().status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE((*p)->audit().ok());
}

TEST(HostPool, UsesHugePagesWhenTheSystemHasThem) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  HostTierConfig c;
  c.capacity_bytes = 8 * 4096;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->backend(), "mmap_2m");
  EXPECT_TRUE((*p)->pinned());
}

TEST(HostPool, FallsBackTo4KPagesAndUnlockedMemory) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  mem->refuse_huge = true;
  mem->refuse_lock = true;
  HostTierConfig c;
  c.capacity_bytes = 8 * 4096;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->backend(), "mmap_4k");
  EXPECT_FALSE((*p)->pinned());
  EXPECT_EQ((*p)->frame_count(), 8u);
  // Memory still works.
  testing::fill_pattern((*p)->frame_address(7), kGeom.page_bytes(), 3);
  EXPECT_TRUE(testing::matches_pattern((*p)->frame_address(7), kGeom.page_bytes(), 3));
}

TEST(HostPool, RunsWithFewerFramesWhenMemoryIsShort) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  mem->refuse_huge = true;
  mem->max_map_bytes = 20 * 4096;
  HostTierConfig c;
  c.capacity_bytes = 64 * 4096;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->frame_count(), 16u);  // 64 -> 32 -> 16 frames
  EXPECT_TRUE((*p)->audit().ok());
}

TEST(HostPool, FailsCleanlyWhenNotEvenOneFrameFits) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  mem->refuse_huge = true;
  mem->max_map_bytes = 100;
  HostTierConfig c;
  c.capacity_bytes = 4 * 4096;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("tiers.host"), std::string::npos);
}

TEST(HostPool, RejectsANumaNodeThatDoesNotExist) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  HostTierConfig c;
  c.capacity_bytes = 4 * 4096;
  c.numa_node = 3;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("tiers.host.numa_node"), std::string::npos);
  mem->nodes = 4;
  auto q = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ((*q)->numa_node(), 3);
}

// NUMA node ids need not be 0..n-1 (here nodes 0 and 2): the configured node is checked against
// the ids, not the count, and the error names the ids there are.
TEST(HostPool, ChecksTheNumaNodeAgainstSparseNodeIds) {
  auto mem = std::make_shared<testing::ScriptedHostMemory>();
  mem->node_ids = {0, 2};
  HostTierConfig c;
  c.capacity_bytes = 4 * 4096;
  c.numa_node = 2;
  auto p = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->numa_node(), 2);

  c.numa_node = 1;  // fewer than the two nodes, yet not one of them
  auto q = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_FALSE(q.ok()) << "node 1 accepted on a machine with nodes 0 and 2";
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("tiers.host.numa_node 1"), std::string::npos)
      << q.status().message();
  EXPECT_NE(q.status().message().find("0, 2"), std::string::npos) << q.status().message();

  c.numa_node = 3;
  auto r = HostPool::create(c, kGeom, nullptr, mem);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0, 2"), std::string::npos) << r.status().message();
}

// The real topology lists each node once, ascending, and a pool can be placed on any of them.
TEST(HostPool, EveryNodeTheSystemListsCanBeChosen) {
  const std::vector<int> ids = system_host_memory()->numa_node_ids();
  ASSERT_FALSE(ids.empty());
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
  EXPECT_EQ(static_cast<int>(ids.size()), system_host_memory()->numa_nodes());
  HostTierConfig c;
  c.capacity_bytes = 4 * 4096;
  c.numa_node = ids.back();
  auto p = HostPool::create(c, kGeom, nullptr);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->numa_node(), ids.back());
}

TEST(HostPool, RealSystemMemoryWorks) {
  HostTierConfig c;
  c.capacity_bytes = 16 * 4096;
  auto p = HostPool::create(c, kGeom, nullptr);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE((*p)->backend() == "mmap_2m" || (*p)->backend() == "mmap_4k");
  testing::fill_pattern((*p)->frame_address(15), kGeom.page_bytes(), 9);
  EXPECT_TRUE(testing::matches_pattern((*p)->frame_address(15), kGeom.page_bytes(), 9));
}

TEST(HostPool, PinnedThroughTheDeviceWhenThereIsOne) {
  auto device = std::make_shared<testing::FakeDevice>();
  HostTierConfig c;
  c.capacity_bytes = 8 * 4096;
  auto p = HostPool::create(c, kGeom, device);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->backend(), "cuda_pinned");
  EXPECT_TRUE((*p)->pinned());
}

TEST(HostPool, PinnedAllocationRefusedFallsBackToMmap) {
  auto device = std::make_shared<testing::FakeDevice>();
  device->refuse_pinned = true;
  HostTierConfig c;
  c.capacity_bytes = 8 * 4096;
  auto p = HostPool::create(c, kGeom, device);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE((*p)->backend() == "mmap_2m" || (*p)->backend() == "mmap_4k");
  EXPECT_EQ((*p)->frame_count(), 8u);
}

TEST(HbmArena, DeviceMemoryShortfallGivesFewerFrames) {
  auto device = std::make_shared<testing::FakeDevice>();
  device->max_device_alloc = 40 * 4096;
  HbmTierConfig c;
  c.capacity_bytes = 100 * 4096;
  auto a = HbmArena::create(c, kGeom, device);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ((*a)->backend(), "cuda");
  EXPECT_TRUE((*a)->device_memory());
  EXPECT_EQ((*a)->frame_count(), 25u);  // 100 -> 50 -> 25
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*a)->frame_address(0)) % 4096, 0u);
}

TEST(HbmArena, BackendSelection) {
  HbmTierConfig c;
  c.backend = HbmBackend::kEmulated;
  auto emulated = select_hbm_device(c);
  ASSERT_TRUE(emulated.ok());
  EXPECT_EQ(*emulated, nullptr);
  if (open_cuda_device(0).ok()) GTEST_SKIP() << "a GPU is present: the no-GPU paths do not apply";
  c.backend = HbmBackend::kAuto;
  auto automatic = select_hbm_device(c);
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(*automatic, nullptr);  // no GPU here: emulated
  c.backend = HbmBackend::kCuda;
  auto forced = select_hbm_device(c);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(forced.status().message().find("tiers.hbm.backend"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
