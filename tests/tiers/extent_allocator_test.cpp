#include "tiers/extent_allocator.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

TEST(ExtentAllocator, MapsIndicesAcrossFiles) {
  auto r = ExtentAllocator::create({3, 2}, 4096 * 3, 4096);
  ASSERT_TRUE(r.ok());
  auto& a = **r;
  EXPECT_EQ(a.capacity(), 5u);
  auto l0 = a.locate(0);
  auto l2 = a.locate(2);
  auto l3 = a.locate(3);
  auto l4 = a.locate(4);
  ASSERT_TRUE(l0.ok() && l2.ok() && l3.ok() && l4.ok());
  EXPECT_EQ(l0->file, 0u);
  EXPECT_EQ(l0->offset, 4096u);
  EXPECT_EQ(l2->offset, 4096u + 2 * 4096 * 3);
  EXPECT_EQ(l3->file, 1u);
  EXPECT_EQ(l3->offset, 4096u);
  EXPECT_EQ(l4->file, 1u);
  EXPECT_EQ(l4->offset, 4096u + 4096 * 3);
  EXPECT_EQ(a.locate(5).status().code(), StatusCode::kOutOfRange);
  for (uint32_t e = 0; e < 5; ++e) {
    auto loc = a.locate(e);
    auto back = a.extent_at(loc->file, loc->offset);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, e);
  }
  EXPECT_EQ(a.extent_at(0, 4097).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.extent_at(1, 4096 + 2 * 4096 * 3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.extent_at(2, 4096).status().code(), StatusCode::kNotFound);
}

TEST(ExtentAllocator, ReserveAllThenAllocateTheRest) {
  auto r = ExtentAllocator::create({4, 4}, 8192, 0);
  ASSERT_TRUE(r.ok());
  auto& a = **r;
  const std::vector<uint32_t> recovered = {1, 5, 6};
  ASSERT_TRUE(a.reserve_all(recovered).ok());
  EXPECT_EQ(a.used(), 3u);
  EXPECT_TRUE(a.is_allocated(5));
  std::vector<uint32_t> got;
  while (true) {
    auto e = a.allocate();
    if (!e.ok()) break;
    got.push_back(*e);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 2, 3, 4, 7}));
  ASSERT_TRUE(a.audit().ok());
  EXPECT_EQ(a.reserve_all(std::vector<uint32_t>{9}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(a.reserve_all(std::vector<uint32_t>{1}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.audit().ok());
}

TEST(ExtentAllocator, RejectsBadGeometry) {
  EXPECT_EQ(ExtentAllocator::create({1}, 0, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
