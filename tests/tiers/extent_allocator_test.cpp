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

// A dead drive's free extents leave service at once; those in use stay allocated (their blocks
// are dropped, and retired as they are freed), and the other files' free extents are handed out
// in the order they would have been.
TEST(ExtentAllocator, RetireFreeInFileTakesOnlyThatFilesFreeExtents) {
  auto r = ExtentAllocator::create({4, 4, 4}, 4096, 4096);
  ASSERT_TRUE(r.ok());
  auto& a = **r;
  std::vector<uint32_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(*a.allocate());
  std::vector<uint32_t> order;  // the order a fresh allocator hands the rest out
  for (int i = 0; i < 9; ++i) order.push_back(*a.allocate());
  for (auto it = order.rbegin(); it != order.rend(); ++it) ASSERT_TRUE(a.free(*it).ok());
  uint32_t in_file1_free = 0;
  for (uint32_t e : order) in_file1_free += a.locate(e)->file == 1 ? 1 : 0;

  EXPECT_EQ(a.retire_free_in_file(1), in_file1_free);
  EXPECT_EQ(a.retired(), in_file1_free);
  EXPECT_EQ(a.in_service(), 12u - in_file1_free);
  EXPECT_EQ(a.used(), 3u);
  std::vector<uint32_t> rest;
  for (Result<uint32_t> e = a.allocate(); e.ok(); e = a.allocate()) rest.push_back(*e);
  std::vector<uint32_t> expected;
  for (uint32_t e : order) {
    if (a.locate(e)->file != 1) expected.push_back(e);
  }
  EXPECT_EQ(rest, expected);
  for (uint32_t e : held) EXPECT_TRUE(a.is_allocated(e));
  EXPECT_EQ(a.retire_free_in_file(1), 0u) << "none left to retire";
  EXPECT_TRUE(a.audit().ok());
}

// A drive readmitted: the retired extents of that file come back free, but those kept (bad
// sectors); those in use stay in use, and other files' retired extents stay retired.
TEST(ExtentAllocator, UnretireInFileBringsBackThatFilesRetiredExtentsButTheKeptOnes) {
  auto r = ExtentAllocator::create({4, 4, 4}, 4096, 4096);
  ASSERT_TRUE(r.ok());
  auto& a = **r;
  std::vector<uint32_t> all;
  for (int i = 0; i < 12; ++i) all.push_back(*a.allocate());
  // File 1 is extents 4..7: 5 is a bad sector, 4 and 6 were retired with the drive, 7 holds a
  // block; extent 0 of file 0 is retired too.
  for (uint32_t e : {0u, 4u, 5u, 6u}) ASSERT_TRUE(a.retire(e).ok());
  for (uint32_t e : all) {
    if (!a.is_retired(e) && e != 7) {
      ASSERT_TRUE(a.free(e).ok());
    }
  }
  EXPECT_EQ(a.first_extent_of(1), 4u);
  std::vector<uint8_t> bad(12, 0);
  bad[5] = 1;
  EXPECT_EQ(a.unretire_in_file(1, bad), 2u);
  EXPECT_EQ(a.retired(), 2u);  // extents 0 and 5
  EXPECT_TRUE(a.is_retired(0));
  EXPECT_TRUE(a.is_retired(5));
  EXPECT_FALSE(a.is_retired(4));
  EXPECT_FALSE(a.is_retired(6));
  EXPECT_TRUE(a.is_allocated(7));
  EXPECT_EQ(a.free_count(), 9u);
  EXPECT_EQ(a.unretire_in_file(1, {}), 1u) << "the bad one, when nothing is kept";
  EXPECT_TRUE(a.audit().ok()) << a.audit().to_string();
}

TEST(ExtentAllocator, RejectsBadGeometry) {
  EXPECT_EQ(ExtentAllocator::create({1}, 0, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
