// The re-binning of the power-of-two latency histogram onto configured buckets: exact where the
// bounds line up, never counting a sample above its bound, and configured lists checked.
#include "runtime/metrics_latency.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvtier/config.hpp"

namespace kvtier {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LatencyBucketMap make_map(std::vector<double> bounds) {
  auto m = LatencyBucketMap::create(bounds);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

TEST(MetricsLatency, PowerOfTwoBoundsAreExact) {
  // 1, 2, 4 and 512 us: each is a source bound.
  const LatencyBucketMap map = make_map({1e-6, 2e-6, 4e-6, 0.000512});
  LatencyHistogram h;
  h.record(500);        // 0.5 us  -> < 1 us
  h.record(1'500);      // 1.5 us  -> [1, 2) us
  h.record(3'999);      // 3.999 us -> [2, 4) us
  h.record(4'000);      // 4 us exactly -> [4, 8) us
  h.record(511'000);    // 511 us -> [256, 512) us
  h.record(2'000'000);  // 2 ms -> above every bound
  const LatencyBuckets b = map.apply(h);
  EXPECT_THAT(b.cumulative, ElementsAre(1u, 2u, 3u, 5u));
  EXPECT_EQ(b.count, 6u);
  EXPECT_DOUBLE_EQ(b.sum_seconds, (500 + 1'500 + 3'999 + 4'000 + 511'000 + 2'000'000) * 1e-9);
}

TEST(MetricsLatency, StraddledBucketCountsOnlyAtTheNextCoveringBound) {
  // 100 us lies inside source bucket [64, 128) us: a 70 us sample is not counted at 100 us (the
  // bucket may hold 120 us samples) but is at 0.25 ms, which covers [128, 256) us too.
  const LatencyBucketMap map = make_map({0.0001, 0.00025});
  LatencyHistogram h;
  h.record(70'000);
  h.record(60'000);  // [32, 64) us: entirely below 100 us
  const LatencyBuckets b = map.apply(h);
  EXPECT_THAT(b.cumulative, ElementsAre(1u, 2u));
  EXPECT_EQ(b.count, 2u);
}

TEST(MetricsLatency, NeverCountsASampleAboveItsBoundAgainstExactModel) {
  const std::vector<double> bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                      0.01,   0.025,   0.05,   0.1,   0.25,   1.0};
  const LatencyBucketMap map = make_map(bounds);
  LatencyHistogram h;
  std::vector<uint64_t> samples;
  std::mt19937_64 rng(7);
  // Log-uniform from 100 ns to 10 s, so every bucket sees samples.
  std::uniform_real_distribution<double> exponent(2.0, 10.0);
  for (int i = 0; i < 20000; ++i) {
    const auto ns = static_cast<uint64_t>(std::pow(10.0, exponent(rng)));
    samples.push_back(ns);
    h.record(ns);
  }
  const LatencyBuckets b = map.apply(h);
  ASSERT_EQ(b.cumulative.size(), bounds.size());
  EXPECT_EQ(b.count, samples.size());
  for (std::size_t j = 0; j < bounds.size(); ++j) {
    uint64_t at_or_below = 0;  // the truth at bound j
    uint64_t below_half = 0;   // what a mapping that loses at most one source bucket still has
    for (const uint64_t ns : samples) {
      if (static_cast<double>(ns) <= bounds[j] * 1e9) ++at_or_below;
      if (static_cast<double>(ns) < bounds[j] * 1e9 / 2) ++below_half;
    }
    EXPECT_LE(b.cumulative[j], at_or_below) << "bound " << bounds[j];
    EXPECT_GE(b.cumulative[j], below_half) << "bound " << bounds[j];
    if (j > 0) {
      EXPECT_GE(b.cumulative[j], b.cumulative[j - 1]);
    }
  }
}

TEST(MetricsLatency, OpenSourceBucketOnlyInInf) {
  const LatencyBucketMap map = make_map({1.0, 1000.0});
  LatencyHistogram h;
  h.record(uint64_t{100} * 1'000'000'000);  // 100 s: beyond the last closed source bucket
  const LatencyBuckets b = map.apply(h);
  EXPECT_THAT(b.cumulative, ElementsAre(0u, 0u));
  EXPECT_EQ(b.count, 1u);
}

TEST(MetricsLatency, BoundsBelowOneMicrosecondReadZero) {
  const LatencyBucketMap map = make_map({5e-7, 1e-6});
  LatencyHistogram h;
  h.record(100);
  EXPECT_THAT(map.apply(h).cumulative, ElementsAre(0u, 1u));
}

TEST(MetricsLatency, RejectsInvalidBucketLists) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<double>> bad = {
      {}, {0.0}, {-1.0}, {nan}, {inf}, {0.1, 0.1}, {0.2, 0.1}, std::vector<double>(65, 1.0)};
  for (const auto& bounds : bad) {
    const auto m = LatencyBucketMap::create(bounds);
    ASSERT_FALSE(m.ok()) << bounds.size() << " bounds accepted";
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("metrics.latency_buckets"));
  }
  const auto m = LatencyBucketMap::create(std::vector<double>{0.001, 0.0005});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("strictly increasing"));
}

TEST(MetricsLatency, AcceptsTheDefaultBuckets) {
  const MetricsConfig defaults;
  EXPECT_TRUE(validate_latency_buckets(defaults.latency_buckets).ok());
}

}  // namespace
}  // namespace kvtier
