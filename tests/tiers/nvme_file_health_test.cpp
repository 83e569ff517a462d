// NvmeFileHealth: media errors in a row on one file, none succeeding between, take it out of
// service (as many as configured; 0 never does); a success starts the count again; the last file
// in service never leaves.
#include "tiers/nvme_file_health.hpp"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

constexpr uint32_t kInARow = NvmeFileHealth::kDefaultFailuresInARow;

TEST(NvmeFileHealth, MediaErrorsInARowTakeAFileOutOfService) {
  NvmeFileHealth h(3);
  for (uint32_t i = 1; i < kInARow; ++i) EXPECT_FALSE(h.on_media_error(1));
  EXPECT_TRUE(h.in_service(1));
  EXPECT_TRUE(h.on_media_error(1));
  EXPECT_FALSE(h.in_service(1));
  EXPECT_EQ(h.out_of_service(), 1u);
  EXPECT_FALSE(h.on_media_error(1)) << "out already: said once";
  EXPECT_TRUE(h.in_service(0));
  EXPECT_TRUE(h.in_service(2));
}

TEST(NvmeFileHealth, ASuccessOnTheFileStartsTheCountAgainOthersDoNot) {
  NvmeFileHealth h(2);
  for (uint32_t i = 1; i < kInARow; ++i) h.on_media_error(0);
  h.on_ok(1);  // another file's success says nothing of this one
  EXPECT_EQ(h.errors_in_a_row(0), kInARow - 1);
  h.on_ok(0);
  EXPECT_EQ(h.errors_in_a_row(0), 0u);
  for (uint32_t i = 1; i < kInARow; ++i) EXPECT_FALSE(h.on_media_error(0));
  EXPECT_TRUE(h.in_service(0));
}

TEST(NvmeFileHealth, TheLastFileInServiceStays) {
  NvmeFileHealth h(2);
  for (uint32_t i = 0; i < kInARow; ++i) h.on_media_error(0);
  ASSERT_FALSE(h.in_service(0));
  for (uint32_t i = 0; i < 10 * kInARow; ++i) EXPECT_FALSE(h.on_media_error(1));
  EXPECT_TRUE(h.in_service(1));
  NvmeFileHealth one(1);
  for (uint32_t i = 0; i < 10 * kInARow; ++i) EXPECT_FALSE(one.on_media_error(0));
  EXPECT_TRUE(one.in_service(0));
  EXPECT_EQ(one.out_of_service(), 0u);
}

TEST(NvmeFileHealth, TheCountIsConfiguredAndZeroNeverTakesAFileOut) {
  NvmeFileHealth three(2, 3);
  EXPECT_EQ(three.failures_in_a_row(), 3u);
  EXPECT_FALSE(three.on_media_error(0));
  EXPECT_FALSE(three.on_media_error(0));
  EXPECT_TRUE(three.on_media_error(0));
  EXPECT_FALSE(three.in_service(0));
  NvmeFileHealth never(2, 0);
  for (uint32_t i = 0; i < 10 * kInARow; ++i) EXPECT_FALSE(never.on_media_error(0));
  EXPECT_TRUE(never.in_service(0));
  EXPECT_EQ(never.out_of_service(), 0u);
}

}  // namespace
}  // namespace kvtier
