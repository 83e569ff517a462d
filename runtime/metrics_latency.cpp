#include "runtime/metrics_latency.hpp"

#include <array>
#include <atomic>
#include <string>
#include <string_view>

#include "runtime/config_validate.hpp"

namespace kvtier {
namespace {

constexpr std::string_view kBucketsKey = "metrics.latency_buckets";

// Source bound i in nanoseconds: exact integers, so the comparison with a configured bound does not
// hinge on how 1e-6 * 2^i rounds.
constexpr double source_upper_ns(int i) { return static_cast<double>(uint64_t{1} << i) * 1000.0; }

}  // namespace

Status validate_latency_buckets(std::span<const double> bounds_seconds) {
  // One rule set for YAML and code-built configs: ask the config validator about a Config that
  // differs from the default only in these bounds, and keep what it says about them.
  Config probe;
  probe.metrics.latency_buckets.assign(bounds_seconds.begin(), bounds_seconds.end());
  std::string message;
  for (const ConfigIssue& issue : find_config_issues(probe)) {
    if (issue.keys.front() != kBucketsKey) continue;
    if (!message.empty()) message += "; ";
    message += issue.keys.front() + ": " + issue.message;
  }
  if (message.empty()) return ok_status();
  return invalid_argument(std::move(message));
}

Result<LatencyBucketMap> LatencyBucketMap::create(std::span<const double> bounds_seconds) {
  KVTIER_RETURN_IF_ERROR(validate_latency_buckets(bounds_seconds));
  std::vector<double> bounds(bounds_seconds.begin(), bounds_seconds.end());
  std::vector<int> covered;
  covered.reserve(bounds.size());
  // The open last source bucket is never covered by a finite bound.
  constexpr int kClosed = LatencyHistogram::kBuckets - 1;
  for (const double b : bounds) {
    // A relative slack of 1e-9 lets a bound written as 0.000512 cover the 512 us bucket although
    // 0.000512 * 1e9 is not exactly 512000 in binary; it cannot let a bucket whose bound is
    // meaningfully above B count at B.
    const double b_ns = b * 1e9 * (1.0 + 1e-9);
    int n = 0;
    while (n < kClosed && source_upper_ns(n) <= b_ns) ++n;
    covered.push_back(n);
  }
  return LatencyBucketMap(std::move(bounds), std::move(covered));
}

LatencyBuckets LatencyBucketMap::apply(const LatencyHistogram& source) const {
  std::array<uint64_t, LatencyHistogram::kBuckets + 1> prefix{};  // prefix[n] = sum of first n
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    prefix[i + 1] = prefix[i] + source.buckets[i].load(std::memory_order_relaxed);
  }
  LatencyBuckets out;
  out.cumulative.reserve(covered_.size());
  for (const int n : covered_) out.cumulative.push_back(prefix[n]);
  out.count = prefix[LatencyHistogram::kBuckets];
  out.sum_seconds = static_cast<double>(source.sum_ns.load(std::memory_order_relaxed)) * 1e-9;
  return out;
}

}  // namespace kvtier
