// NvmeFileHealth: media errors in a row on one file, none succeeding between, take it out of
// service (as many as configured; 0 never does); a success starts the count again; the last file
// in service never leaves. A file out of service is probed after readmit_after, then after twice
// each wait before, up to 16 times the first; a probe that succeeds puts it back in service.
#include "tiers/nvme_file_health.hpp"

#include <gtest/gtest.h>

#include <chrono>

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

using std::chrono::milliseconds;
using Clock = NvmeFileHealth::Clock;

// Takes `file` out of service at `now`.
void take_out(NvmeFileHealth& h, uint32_t file, Clock::time_point now) {
  for (uint32_t i = 0; i < kInARow; ++i) h.on_media_error(file, now);
  ASSERT_FALSE(h.in_service(file));
}

TEST(NvmeFileHealth, AFileOutIsProbedAfterTheWaitOneProbeAtATime) {
  NvmeFileHealth h(3, kInARow, milliseconds(100));
  const Clock::time_point t0{};
  EXPECT_TRUE(h.probes_due(t0 + milliseconds(10'000)).empty()) << "every file in service";
  take_out(h, 1, t0);
  EXPECT_TRUE(h.probes_due(t0 + milliseconds(99)).empty());
  EXPECT_EQ(h.probes_due(t0 + milliseconds(100)), std::vector<uint32_t>{1});
  EXPECT_TRUE(h.probes_due(t0 + milliseconds(500)).empty()) << "its probe is in flight";
  EXPECT_TRUE(h.probe_ended(1, true, t0 + milliseconds(101)));
  EXPECT_TRUE(h.in_service(1));
  EXPECT_EQ(h.out_of_service(), 0u);
  EXPECT_EQ(h.errors_in_a_row(1), 0u) << "the count starts again";
  for (uint32_t i = 1; i < kInARow; ++i) EXPECT_FALSE(h.on_media_error(1, t0));
  EXPECT_TRUE(h.on_media_error(1, t0)) << "and a dead drive goes out again as before";
}

TEST(NvmeFileHealth, EachFailedProbeOrNewOutageDoublesTheWaitUpToSixteenTimes) {
  NvmeFileHealth h(2, kInARow, milliseconds(100));
  Clock::time_point now{};
  take_out(h, 0, now);
  std::vector<int64_t> waits;
  for (int i = 0; i < 7; ++i) {
    const Clock::time_point at = h.probe_at(0);
    waits.push_back(std::chrono::duration_cast<milliseconds>(at - now).count());
    EXPECT_TRUE(h.probes_due(at - milliseconds(1)).empty());
    ASSERT_EQ(h.probes_due(at), std::vector<uint32_t>{0});
    now = at;
    EXPECT_FALSE(h.probe_ended(0, false, now));
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 200, 400, 800, 1600, 1600, 1600}));
  // Readmitted, then out again: the wait goes on from where it was.
  ASSERT_EQ(h.probes_due(h.probe_at(0)), std::vector<uint32_t>{0});
  EXPECT_TRUE(h.probe_ended(0, true, now));
  take_out(h, 0, now);
  EXPECT_EQ(h.probe_at(0) - now, milliseconds(1600));
}

TEST(NvmeFileHealth, ZeroReadmitAfterNeverProbes) {
  NvmeFileHealth h(2, kInARow, milliseconds(0));
  take_out(h, 0, Clock::time_point{});
  EXPECT_TRUE(h.probes_due(Clock::time_point{} + std::chrono::hours(24 * 365)).empty());
  EXPECT_FALSE(h.in_service(0));
}

TEST(NvmeFileHealth, AProbeEndingForAFileInServiceChangesNothing) {
  NvmeFileHealth h(2, kInARow, milliseconds(100));
  EXPECT_FALSE(h.probe_ended(1, true, Clock::time_point{}));
  EXPECT_FALSE(h.probe_ended(1, false, Clock::time_point{}));
  EXPECT_TRUE(h.in_service(1));
  EXPECT_EQ(h.out_of_service(), 0u);
}

}  // namespace
}  // namespace kvtier
