#include "runtime/config_validate.hpp"

#include <cmath>
#include <set>
#include <string_view>

#include "runtime/config_size.hpp"
#include "runtime/config_sizing.hpp"
#include "runtime/metrics_listen.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {
namespace {

class Issues {
 public:
  void add(std::vector<std::string> keys, std::string message) {
    issues_.push_back(ConfigIssue{std::move(keys), std::move(message)});
  }
  void add(std::string key, std::string message) {
    add(std::vector<std::string>{std::move(key)}, std::move(message));
  }
  std::vector<ConfigIssue> take() { return std::move(issues_); }

 private:
  std::vector<ConfigIssue> issues_;
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_range(Issues& out, const std::string& key, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    out.add(key, std::to_string(value) + " is out of range; it must be in " + std::to_string(lo) +
                     ".." + std::to_string(hi));
  }
}

void check_bandwidth(Issues& out, const std::string& key, double gbps) {
  if (!std::isfinite(gbps) || gbps < 0) {
    out.add(key, num(gbps) + " is not a bandwidth; it must be a finite number of GB/s >= 0");
  }
}

void check_watermarks(Issues& out, const std::string& tier, const Watermarks& w) {
  const std::string base = "tiers." + tier + ".watermarks";
  bool each_ok = true;
  for (auto [name, value] : {std::pair<std::string_view, double>{"low", w.low}, {"high", w.high}}) {
    if (!(value > 0.0 && value <= 1.0)) {  // also rejects NaN
      out.add(base + "." + std::string(name),
              num(value) + " is outside (0, 1]; a watermark is a fraction of the tier's capacity");
      each_ok = false;
    }
  }
  if (each_ok && w.low > w.high) {
    out.add({base + ".low", base + ".high", base},
            "low (" + num(w.low) + ") is above high (" + num(w.high) +
                "); demotion starts above high and stops at low, so low must be <= high");
  }
}

const std::vector<std::string> kGeometryKeys = {"model.page_tokens", "model.kv_heads",
                                                "model.head_dim", "model.dtype", "model.layers"};

// `key` first, then the geometry keys: a size rule about `key` that the model's shape also decides.
std::vector<std::string> with_geometry(std::string key) {
  std::vector<std::string> keys = {std::move(key)};
  keys.insert(keys.end(), kGeometryKeys.begin(), kGeometryKeys.end());
  return keys;
}

// A frame-indexed tier must hold at least one frame and no more than FrameAllocator can index.
void check_frames(Issues& out, const std::string& tier, uint64_t capacity, uint64_t frames,
                  uint64_t frame_bytes) {
  const std::string key = "tiers." + tier + ".capacity";
  if (capacity == 0) {
    out.add(key, "must be greater than 0 bytes");
  } else if (frames == 0) {
    out.add(with_geometry(key), format_size(capacity) +
                                    " holds no frame: one page of the model takes " +
                                    format_size(frame_bytes));
  } else if (frames > FrameAllocator::kMaxFrames) {
    out.add(with_geometry(key),
            format_size(capacity) + " holds " + std::to_string(frames) + " frames, more than the " +
                std::to_string(FrameAllocator::kMaxFrames) + " one tier can index");
  }
}

void check_model(Issues& out, const ModelConfig& m) {
  if (m.name.empty()) out.add("model.name", "must not be empty");
  const Geometry& g = m.geometry;
  check_range(out, "model.layers", g.layers, 1, kMaxLayers);
  check_range(out, "model.kv_heads", g.kv_heads, 1, kMaxKvHeads);
  if (g.head_dim == 0 || g.head_dim > kMaxHeadDim || g.head_dim % kHeadDimMultiple != 0) {
    out.add("model.head_dim", std::to_string(g.head_dim) + " must be a multiple of " +
                                  std::to_string(kHeadDimMultiple) + " in " +
                                  std::to_string(kHeadDimMultiple) + ".." +
                                  std::to_string(kMaxHeadDim));
  }
  check_range(out, "model.page_tokens", g.page_tokens, 1, kMaxPageTokens);
  if (dtype_size(g.dtype) == 0) out.add("model.dtype", "is not a known dtype");
}

bool geometry_in_bounds(const Geometry& g) {
  return g.layers >= 1 && g.layers <= kMaxLayers && g.kv_heads >= 1 && g.kv_heads <= kMaxKvHeads &&
         g.head_dim >= 1 && g.head_dim <= kMaxHeadDim && g.page_tokens >= 1 &&
         g.page_tokens <= kMaxPageTokens && dtype_size(g.dtype) != 0;
}

// With the exporter's own parser: anything it would refuse at open (where that is only a log line
// and the runtime runs without metrics) is refused here, under metrics.listen.
void check_listen(Issues& out, const std::string& listen) {
  if (listen.empty()) return;
  const std::string why = listen_address_problem(listen);
  if (why.empty()) return;
  out.add("metrics.listen", "\"" + listen + "\" is not a listen address (" + why +
                                "); write host:port (e.g. 127.0.0.1:9464 or [::1]:9464), or "
                                "\"\" / off to disable metrics");
}

}  // namespace

std::vector<ConfigIssue> find_config_issues(const Config& config) {
  Issues out;
  check_model(out, config.model);
  const Geometry& g = config.model.geometry;
  const bool geometry_ok = geometry_in_bounds(g);
  const TierSizing sizing = size_tiers(config);
  if (geometry_ok && sizing.block_bytes > kMaxBlockBytes) {
    out.add(kGeometryKeys, "a block (" + std::to_string(g.layers) + " layers x " +
                               format_size(sizing.page_bytes) + " pages) is " +
                               format_size(sizing.block_bytes) + ", above the " +
                               format_size(kMaxBlockBytes) + " limit");
  }

  const TiersConfig& t = config.tiers;
  if (geometry_ok) {
    check_frames(out, "hbm", t.hbm.capacity_bytes, sizing.hbm_frames, sizing.frame_bytes);
    check_frames(out, "host", t.host.capacity_bytes, sizing.host_frames, sizing.host_frame_bytes);
  } else {
    if (t.hbm.capacity_bytes == 0) out.add("tiers.hbm.capacity", "must be greater than 0 bytes");
    if (t.host.capacity_bytes == 0) out.add("tiers.host.capacity", "must be greater than 0 bytes");
  }
  if (t.hbm.device < 0 || t.hbm.device > kMaxCudaDevice) {
    out.add("tiers.hbm.device", std::to_string(t.hbm.device) +
                                    " is out of range; it must be in 0.." +
                                    std::to_string(kMaxCudaDevice));
  }
  check_watermarks(out, "hbm", t.hbm.watermarks);
  check_bandwidth(out, "tiers.hbm.link_gbps", t.hbm.link_gbps);

  if (t.host.numa_node < -1 || t.host.numa_node > kMaxNumaNode) {
    out.add("tiers.host.numa", std::to_string(t.host.numa_node) +
                                   " is not a NUMA node; write auto or a node number in 0.." +
                                   std::to_string(kMaxNumaNode));
  }
  check_watermarks(out, "host", t.host.watermarks);

  const NvmeTierConfig& n = t.nvme;
  const PageFormat host_format = t.host_page_format(g);
  if (n.enabled && host_format.encodes() && !(t.nvme_page_format(g) == host_format)) {
    // The host hands NVMe its pages as they are; widening them again would double the bytes on
    // disk and bring back no precision.
    out.add("tiers.nvme.kv_dtype",
            "is model, but tiers.host.kv_dtype is fp8_e4m3: blocks reach NVMe from the host "
            "already in fp8; set tiers.nvme.kv_dtype: fp8_e4m3 (or the host tier back to model)");
  }
  if (n.enabled) {
    if (n.paths.empty()) {
      out.add("tiers.nvme.paths", "is empty; list at least one file or block device");
    }
    std::set<std::string_view> seen;
    for (std::size_t i = 0; i < n.paths.size(); ++i) {
      if (n.paths[i].empty()) {
        out.add("tiers.nvme.paths", "entry " + std::to_string(i) + " is an empty path");
      } else if (n.paths[i].find("${") != std::string::npos) {
        out.add("tiers.nvme.paths", "\"" + n.paths[i] +
                                        "\" holds an unexpanded ${...}; the loader expands "
                                        "${KVTIER_CACHE_DIR} (runtime/config_loader.hpp)");
      } else if (!seen.insert(n.paths[i]).second) {
        out.add("tiers.nvme.paths", "\"" + n.paths[i] + "\" is listed twice");
      }
    }
    if (n.capacity_bytes == 0) {
      out.add("tiers.nvme.capacity",
              "must be greater than 0 bytes (or set tiers.nvme.enabled: false)");
    } else if (geometry_ok && !n.paths.empty() && sizing.block_bytes <= kMaxBlockBytes) {
      if (sizing.nvme_bytes_per_file < sizing.nvme_extent_bytes) {
        out.add(with_geometry("tiers.nvme.capacity"),
                format_size(n.capacity_bytes) + " over " + std::to_string(n.paths.size()) +
                    " path(s) leaves " + format_size(sizing.nvme_bytes_per_file) +
                    " per file, less than one block extent (" +
                    format_size(sizing.nvme_extent_bytes) + ")");
      } else if (sizing.nvme_extents() > FrameAllocator::kMaxFrames) {
        out.add(with_geometry("tiers.nvme.capacity"),
                format_size(n.capacity_bytes) + " holds " + std::to_string(sizing.nvme_extents()) +
                    " extents, more than the " + std::to_string(FrameAllocator::kMaxFrames) +
                    " one store can index");
      }
    }
    check_range(out, "tiers.nvme.queue_depth", n.queue_depth, 1, kMaxQueueDepth);
    check_range(out, "tiers.nvme.io_threads", n.io_threads, 1, kMaxIoThreads);
    if (n.direct_io && geometry_ok && sizing.page_bytes % kDirectIoAlignment != 0) {
      out.add(with_geometry("tiers.nvme.direct_io"),
              "a page of 2 x " + std::to_string(g.page_tokens) + " tokens x " +
                  std::to_string(g.kv_heads) + " kv heads x " + std::to_string(g.head_dim) + " x " +
                  std::to_string(dtype_size(g.dtype)) + " bytes (" +
                  std::string(dtype_name(g.dtype)) + ") is " + std::to_string(sizing.page_bytes) +
                  " bytes, not a multiple of 512 as O_DIRECT needs (tiers.nvme.direct_io is "
                  "true); change the geometry or set tiers.nvme.direct_io: false");
    }
    check_watermarks(out, "nvme", n.watermarks);
    check_range(out, "tiers.nvme.pause_ms", n.pause_ms, 1, kMaxNvmePauseMs);
    check_range(out, "tiers.nvme.io_timeout_ms", n.io_timeout_ms, 0, kMaxNvmeIoTimeoutMs);
    check_range(out, "tiers.nvme.readmit_after_ms", n.readmit_after_ms, 0, kMaxNvmeReadmitAfterMs);
  }
  check_bandwidth(out, "tiers.nvme.read_gbps", n.read_gbps);
  check_bandwidth(out, "tiers.nvme.write_gbps", n.write_gbps);

  const PoliciesConfig& p = config.policies;
  if (p.write_selective_hits == 0) {
    out.add("policies.write_selective_hits", "must be at least 1");
  }
  if (p.prefetch.layer_window == 0) out.add("policies.prefetch.layer_window", "must be at least 1");
  if (p.prefetch.deadline_ms == 0) {
    out.add("policies.prefetch.deadline_ms",
            "must be at least 1: every wait has a deadline, and 0 would make every load late");
  }
  if (!std::isfinite(p.prefill_tokens_per_s) || p.prefill_tokens_per_s <= 0) {
    out.add("policies.prefill_tokens_per_s",
            num(p.prefill_tokens_per_s) + " must be a finite number of tokens per second > 0");
  }
  if (!std::isfinite(p.pin_quota) || p.pin_quota <= 0 || p.pin_quota > 1) {
    out.add("policies.pin_quota", num(p.pin_quota) + " must be a fraction of HBM in (0, 1]");
  }

  const MetricsConfig& m = config.metrics;
  check_listen(out, m.listen);
  if (m.latency_buckets.empty() || m.latency_buckets.size() > kMaxLatencyBuckets) {
    out.add("metrics.latency_buckets", "must list 1.." + std::to_string(kMaxLatencyBuckets) +
                                           " bucket bounds (seconds), not " +
                                           std::to_string(m.latency_buckets.size()));
  }
  for (std::size_t i = 0; i < m.latency_buckets.size(); ++i) {
    const double b = m.latency_buckets[i];
    if (!std::isfinite(b) || b <= 0) {
      out.add("metrics.latency_buckets",
              "entry " + std::to_string(i) + " (" + num(b) + ") must be a finite number > 0");
      break;
    }
    if (i > 0 && !(b > m.latency_buckets[i - 1])) {
      out.add("metrics.latency_buckets",
              "entry " + std::to_string(i) + " (" + num(b) + ") is not above the one before (" +
                  num(m.latency_buckets[i - 1]) + "); bounds must be strictly increasing");
      break;
    }
  }
  return out.take();
}

Status validate_config(const Config& config) {
  const std::vector<ConfigIssue> issues = find_config_issues(config);
  if (issues.empty()) return ok_status();
  std::string message;
  for (const ConfigIssue& issue : issues) {
    if (!message.empty()) message += "; ";
    message += issue.keys.front() + ": " + issue.message;
  }
  return invalid_argument(std::move(message));
}

}  // namespace kvtier
