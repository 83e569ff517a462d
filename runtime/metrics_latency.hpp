// LatencyBucketMap: re-bins the transfer engine's fixed power-of-two latency histogram
// (include/kvtier/transfer_stats.hpp) onto the bucket bounds configured in
// `metrics.latency_buckets`, at scrape time.
//
// Mapping (conservative): source bucket i holds samples below 2^i microseconds (bucket 0: below
// 1 us; the last is open). The cumulative count exported at a configured bound B is the sum of the
// source buckets whose upper bound is <= B, so every sample counted at B really was <= B. A source
// bucket that straddles B (2^(i-1) us < B < 2^i us) is counted only at the next bound that covers
// it, never earlier: counts at B may be lower than the truth, never higher, and a quantile
// estimated from them (histogram_quantile) errs toward higher latency, never lower. At bounds that
// are powers of two microseconds (1e-6 * 2^k s) the count misses only samples of exactly B;
// elsewhere it misses at most the samples of one source bucket (within a factor of two of B).
// Bounds below 1 us always read 0; samples of the open source bucket (>= 2^26 us, about 67 s)
// appear only in +Inf.
//
// Consistency: the source's fields are separate relaxed atomics, so a scrape that races a record()
// may see a bucket without its count. The exported _count is therefore the sum of the source
// buckets read in this scrape (so +Inf == _count and buckets are monotone within a scrape), and
// each exported value is monotone across scrapes because each source atomic only grows.
//
// Immutable after create(); apply() may run on any thread. Rejected: configuring the source bounds
// to match (would drag MetricsConfig into tiers/ and make record() depend on a runtime list) and
// interpolating inside a straddling bucket (a guess presented as a count).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/status.hpp"
#include "kvtier/transfer_stats.hpp"

namespace kvtier {

// The source histogram read once, in Prometheus form.
struct LatencyBuckets {
  std::vector<uint64_t> cumulative;  // one per configured bound, same order
  uint64_t count = 0;                // every sample, = the +Inf bucket
  double sum_seconds = 0.0;
};

class LatencyBucketMap {
 public:
  // kInvalidArgument unless `bounds_seconds` satisfies metrics.latency_buckets' rules (1..64
  // finite bounds > 0, strictly increasing); the message names the key and the offending entry.
  static Result<LatencyBucketMap> create(std::span<const double> bounds_seconds);

  const std::vector<double>& bounds() const { return bounds_; }
  LatencyBuckets apply(const LatencyHistogram& source) const;

 private:
  LatencyBucketMap(std::vector<double> bounds, std::vector<int> covered)
      : bounds_(std::move(bounds)), covered_(std::move(covered)) {}

  std::vector<double> bounds_;
  // covered_[j]: how many leading source buckets lie entirely at or below bounds_[j].
  std::vector<int> covered_;
};

// The same rules as the config validator applies to metrics.latency_buckets.
Status validate_latency_buckets(std::span<const double> bounds_seconds);

}  // namespace kvtier
