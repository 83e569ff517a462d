#include "runtime/config_describe.hpp"

#include <cstdio>

#include "runtime/config_names.hpp"
#include "runtime/config_size.hpp"
#include "runtime/config_sizing.hpp"

namespace kvtier {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string on_off(bool b) { return b ? "on" : "off"; }

std::string size_text(uint64_t bytes) {
  return format_size_approx(bytes) + " (" + std::to_string(bytes) + " B)";
}

std::string watermarks(const Watermarks& w) {
  return "watermarks low " + num(w.low) + " high " + num(w.high);
}

std::string gbps(double v, std::string_view zero_means) {
  return v > 0 ? num(v) + " GB/s" : std::string(zero_means);
}

}  // namespace

std::string describe_config(const Config& config) {
  const Geometry& g = config.model.geometry;
  const TierSizing s = size_tiers(config);
  std::string out;
  auto line = [&out](const std::string& text) {
    out += text;
    out += '\n';
  };

  line("model     " + config.model.name + " (key namespace \"" +
       (config.model.key_namespace.empty() ? config.model.name : config.model.key_namespace) +
       "\")");
  line("geometry  " + std::to_string(g.layers) + " layers, " + std::to_string(g.kv_heads) +
       " kv heads x head_dim " + std::to_string(g.head_dim) + ", " +
       std::string(dtype_name(g.dtype)) + ", " + std::to_string(g.page_tokens) + " tokens/page");
  line("          page " + size_text(s.page_bytes) + ", block " + size_text(s.block_bytes) +
       ", KV per token " +
       size_text(s.page_bytes / (g.page_tokens == 0 ? 1 : g.page_tokens) * g.layers));

  const TiersConfig& t = config.tiers;
  line("tier hbm  backend " + std::string(enum_name(t.hbm.backend)) + ", device " +
       std::to_string(t.hbm.device) + ", capacity " + size_text(t.hbm.capacity_bytes));
  line("          " + std::to_string(s.hbm_frames) + " frames of " +
       format_size_approx(s.frame_bytes) + ", " + watermarks(t.hbm.watermarks) +
       ", link throttle " + gbps(t.hbm.link_gbps, "off"));
  line("tier host capacity " + size_text(t.host.capacity_bytes) + ", numa " +
       (t.host.numa_node < 0 ? std::string("auto") : std::to_string(t.host.numa_node)) +
       ", huge pages " + on_off(t.host.huge_pages) + ", lock memory " + on_off(t.host.lock_memory) +
       ", pages held as " +
       std::string(dtype_name(t.host_page_format(config.model.geometry).stored_dtype)));
  line("          " + std::to_string(s.host_frames) + " frames of " +
       format_size_approx(s.host_frame_bytes) + ", " + watermarks(t.host.watermarks));
  const NvmeTierConfig& n = t.nvme;
  if (!n.enabled) {
    line("tier nvme disabled");
  } else {
    line("tier nvme capacity " + size_text(n.capacity_bytes) + " over " +
         std::to_string(n.paths.size()) + (n.paths.size() == 1 ? " path" : " paths") +
         ", checksum " + std::string(enum_name(n.checksum)) + ", pages stored as " +
         std::string(dtype_name(t.nvme_page_format(config.model.geometry).stored_dtype)));
    line("          direct I/O " + on_off(n.direct_io) + ", queue depth " +
         std::to_string(n.queue_depth) + ", " + std::to_string(n.io_threads) +
         (n.io_threads == 1 ? " I/O thread" : " I/O threads") + ", sqpoll " + on_off(n.sqpoll));
    line("          " + std::to_string(s.nvme_extents()) + " extents of " +
         format_size_approx(s.nvme_extent_bytes) + " (" + format_size_approx(s.nvme_header_bytes) +
         " header + " + std::to_string(g.layers) + " x " + format_size_approx(s.nvme_page_stride) +
         " pages), " + watermarks(n.watermarks));
    line("          read " + gbps(n.read_gbps, "unknown") + ", write " +
         gbps(n.write_gbps, "unknown"));
    const auto pauses = [&](const char* what, uint32_t after) {
      line(after == 0 ? "          " + std::string(what) + " never paused after failures"
                      : "          " + std::string(what) + " paused " + std::to_string(n.pause_ms) +
                            " ms after " + std::to_string(after) + " failed in a row");
    };
    pauses("writes", n.pause_after_failed_writes);
    pauses("reads", n.pause_after_failed_reads);
    line(n.io_timeout_ms == 0 ? "          requests never time out"
                              : "          a request unanswered for " +
                                    std::to_string(n.io_timeout_ms) + " ms fails its drive");
    line(n.out_of_service_after_failures == 0
             ? "          files never taken out of service"
             : "          a file out of service after " +
                   std::to_string(n.out_of_service_after_failures) + " failed in a row");
    line(n.readmit_after_ms == 0 ? "          a file out of service stays out until a restart"
                                 : "          a file out of service probed after " +
                                       std::to_string(n.readmit_after_ms) + " ms");
    for (std::size_t i = 0; i < n.paths.size(); ++i) {
      const uint64_t extents = i < s.nvme_extents_per_file.size() ? s.nvme_extents_per_file[i] : 0;
      line("          path " + n.paths[i] + " (" + std::to_string(extents) + " extents)");
    }
  }

  const PoliciesConfig& p = config.policies;
  std::string write = std::string(enum_name(p.write));
  if (p.write == WritePolicy::kWriteThroughSelective) {
    write += " after " + std::to_string(p.write_selective_hits) + " hits";
  }
  line("policies  eviction " + std::string(enum_name(p.eviction)) + ", write " + write +
       ", nvme admission after " + std::to_string(p.admission.nvme_min_hits) + " hits");
  line("          prefetch depth " + std::to_string(p.prefetch.depth) + ", layerwise " +
       on_off(p.prefetch.layerwise) + ", layer window " + std::to_string(p.prefetch.layer_window) +
       ", deadline " + std::to_string(p.prefetch.deadline_ms) + " ms, late pages " +
       std::string(enum_name(p.prefetch.on_late)) + ", prefill " + num(p.prefill_tokens_per_s) +
       " tokens/s, pin quota " + num(p.pin_quota));

  const MetricsConfig& m = config.metrics;
  std::string buckets = std::to_string(m.latency_buckets.size()) + " latency buckets";
  if (!m.latency_buckets.empty()) {
    buckets +=
        " " + num(m.latency_buckets.front()) + " s .. " + num(m.latency_buckets.back()) + " s";
  }
  line("metrics   " + (m.listen.empty() ? std::string("off") : "listen " + m.listen) + ", " +
       buckets);
  return out;
}

}  // namespace kvtier
