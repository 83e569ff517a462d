// Counters of the transfer engine and the tiers: what moved over which link, what failed, how long
// it took.
//
// Plain structs of relaxed atomics, written on the data path by whichever thread completes a
// transfer (a copy worker, a CUDA host callback, an io_uring thread) and read at scrape time by
// runtime/ (Prometheus) or by tests. Reads are not a consistent snapshot across fields; each field
// is exact on its own at a quiescent point. Nothing here allocates or locks, so recording is cheap
// enough for every transfer.
//
// Latency is kept as a histogram with power-of-two bucket bounds (bucket i counts samples below
// 2^i microseconds; the last bucket is open) plus an exact count and sum. Fixed bounds keep
// recording lock-free; the exporter maps them onto its configured buckets (every configured bound
// falls between two of ours, so a cumulative count is exact at our bounds and conservative
// between). Rejected: a reservoir of raw samples (needs a lock or a ring with torn reads) and
// configurable bounds here (would drag MetricsConfig into the tiers).
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <string_view>

namespace kvtier {

// The four links between tiers, as seen by the transfer engine.
enum class Link : uint8_t { kHbmToHost = 0, kHostToHbm = 1, kHostToNvme = 2, kNvmeToHost = 3 };
constexpr int kNumLinks = 4;
constexpr std::array<Link, kNumLinks> kAllLinks = {Link::kHbmToHost, Link::kHostToHbm,
                                                   Link::kHostToNvme, Link::kNvmeToHost};

// Metric label pairs: {src, dst}.
constexpr std::string_view link_src(Link l) {
  switch (l) {
    case Link::kHbmToHost: return "hbm";
    case Link::kHostToHbm: return "host";
    case Link::kHostToNvme: return "host";
    case Link::kNvmeToHost: return "nvme";
  }
  return "unknown";
}
constexpr std::string_view link_dst(Link l) {
  switch (l) {
    case Link::kHbmToHost: return "host";
    case Link::kHostToHbm: return "hbm";
    case Link::kHostToNvme: return "nvme";
    case Link::kNvmeToHost: return "host";
  }
  return "unknown";
}
constexpr std::string_view link_name(Link l) {
  switch (l) {
    case Link::kHbmToHost: return "hbm->host";
    case Link::kHostToHbm: return "host->hbm";
    case Link::kHostToNvme: return "host->nvme";
    case Link::kNvmeToHost: return "nvme->host";
  }
  return "unknown";
}

struct LatencyHistogram {
  static constexpr int kBuckets = 28;  // 1 us .. 2^26 us (~67 s), then the open bucket

  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> sum_ns{0};
  std::atomic<uint64_t> max_ns{0};
  std::array<std::atomic<uint64_t>, kBuckets> buckets{};

  // Upper bound (exclusive) of bucket i in seconds; the last bucket has none (infinity).
  static constexpr double bucket_upper_seconds(int i) {
    return static_cast<double>(uint64_t{1} << i) * 1e-6;
  }
  static constexpr int bucket_of(uint64_t ns) {
    const uint64_t us = ns / 1000;
    const int b = us == 0 ? 0 : std::bit_width(us);  // us < 2^b
    return b < kBuckets - 1 ? b : kBuckets - 1;
  }

  void record(uint64_t ns) {
    count.fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(ns, std::memory_order_relaxed);
    buckets[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
    uint64_t prev = max_ns.load(std::memory_order_relaxed);
    while (ns > prev && !max_ns.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
    }
  }
};

struct LinkStats {
  std::atomic<uint64_t> bytes{0};      // payload bytes of transfers that completed OK
  std::atomic<uint64_t> ops{0};        // transfers that completed OK
  std::atomic<uint64_t> errors{0};     // transfers that failed (I/O error, device error, data loss)
  std::atomic<uint64_t> cancelled{0};  // transfers cancelled before they started
  LatencyHistogram latency;            // submit -> completion, OK transfers only
};

struct TransferStats {
  std::array<LinkStats, kNumLinks> links;

  // NVMe store.
  std::atomic<uint64_t> checksum_failures{0};  // extents dropped because a checksum did not match
  std::atomic<uint64_t> io_requeued{0};        // short reads/writes and -EAGAIN resubmitted
  std::atomic<uint64_t> io_errors{0};      // failed system calls (each names file, offset, errno)
  std::atomic<uint64_t> sq_full_waits{0};  // submissions held back because the SQ was full
  std::atomic<uint64_t> recovered_blocks{0};  // blocks found by the restart scan
  std::atomic<uint64_t> dropped_extents{0};   // extents dropped at recovery (torn, foreign, dup)
  std::atomic<uint64_t> files_out_of_service{0};  // gauge: files (drives) dead after media errors
  // Requests a drive left unanswered past tiers.nvme.io_timeout_ms (a hung drive), and the gauge
  // of those still unanswered (their memory stays reserved until the drive answers).
  std::atomic<uint64_t> io_timeouts{0};
  std::atomic<uint64_t> requests_unanswered{0};
  // Probes of files out of service (tiers.nvme.readmit_after_ms), and the files they put back.
  std::atomic<uint64_t> nvme_probes{0};
  std::atomic<uint64_t> files_readmitted{0};
  // Blank files or devices formatted in place of a lost one (a replaced drive), at open or probe.
  std::atomic<uint64_t> files_replaced{0};

  // Copy engines.
  std::atomic<uint64_t> copy_segments{0};  // physical copies issued after batching
  std::atomic<uint64_t> copy_pages{0};     // pages those copies carried

  LinkStats& link(Link l) { return links[static_cast<int>(l)]; }
  const LinkStats& link(Link l) const { return links[static_cast<int>(l)]; }
};

}  // namespace kvtier
