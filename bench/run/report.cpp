// Table, JSON, CSV and plot of a run. See report.hpp.
#include "bench/run/report.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string_view>

#include "bench/run/subprocess.hpp"

namespace kvtier::bench::run {
namespace {

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string percent(double v) { return std::isfinite(v) ? fixed(100.0 * v, 1) + " %" : "-"; }

// Milliseconds with a precision that suits their size.
std::string millis(double ms) {
  if (ms >= 100000) return fixed(ms / 1000.0, 0) + " s";
  if (ms >= 10000) return fixed(ms / 1000.0, 1) + " s";
  if (ms >= 100) return fixed(ms, 0);
  if (ms >= 1) return fixed(ms, 1);
  return fixed(ms, 3);
}

const BaselineResult* find(const RunReport& r, std::string_view name) {
  for (const BaselineResult& b : r.baselines) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

double ratio(double a, double b) { return b > 0 ? a / b : std::nan(""); }

// Two decimals, or two significant digits when smaller ("1.00", "0.35", "0.031", "7.7e-05").
std::string ratio_text(double r) {
  if (!std::isfinite(r)) return "-";
  if (r >= 0.1) return fixed(r, 2);
  std::ostringstream s;
  s << std::setprecision(2) << r;
  return s.str();
}

// ---- A minimal JSON writer: objects, arrays, strings, finite numbers (null otherwise) ----
class Json {
 public:
  explicit Json(std::ostream& os) : os_(os) {}
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(std::string_view k) {
    comma();
    string(k);
    os_ << ": ";
    after_key_ = true;
  }
  void value(double v) {
    comma();
    if (std::isfinite(v)) {
      std::ostringstream s;
      s << std::setprecision(10) << v;
      os_ << s.str();
    } else {
      os_ << "null";
    }
  }
  void value(uint64_t v) {
    comma();
    os_ << v;
  }
  void value(bool v) {
    comma();
    os_ << (v ? "true" : "false");
  }
  void value(std::string_view v) {
    comma();
    string(v);
  }
  void field(std::string_view k, double v) { key(k), value(v); }
  void field(std::string_view k, uint64_t v) { key(k), value(v); }
  void field(std::string_view k, std::string_view v) { key(k), value(v); }
  void field(std::string_view k, bool v) { key(k), value(v); }

 private:
  void open(char c) {
    comma();
    os_ << c;
    first_ = true;
  }
  void close(char c) {
    os_ << c;
    first_ = false;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) os_ << ", ";
    first_ = false;
  }
  void string(std::string_view s) {
    os_ << '"';
    for (char c : s) {
      switch (c) {
        case '"': os_ << "\\\""; break;
        case '\\': os_ << "\\\\"; break;
        case '\n': os_ << "\\n"; break;
        case '\t': os_ << "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            os_ << "\\u00"
                << "0123456789abcdef"[(c >> 4) & 0xf] << "0123456789abcdef"[c & 0xf];
          } else {
            os_ << c;
          }
      }
    }
    os_ << '"';
  }

  std::ostream& os_;
  bool first_ = true;
  bool after_key_ = false;
};

// The scalar columns shared by the table, JSON and CSV.
struct Column {
  std::string_view key;    // JSON/CSV name
  std::string_view label;  // table row label
  std::function<double(const BaselineResult&)> get;
  std::function<std::string(double)> show;
};

std::vector<Column> columns() {
  const auto count = [](double v) { return fixed(v, 0); };
  const auto ms = [](double v) { return millis(v); };
  const auto pct = [](double v) { return percent(v); };
  const auto rate = [](double v) { return fixed(v, v >= 100 ? 0 : 2); };
  const auto secs = [](double v) { return fixed(v, v >= 100 ? 0 : 2); };
  const auto bytes = [](double v) { return human_bytes(v); };
  const auto link_bytes = [](Link l) {
    return [l](const BaselineResult& b) {
      return static_cast<double>(b.link_bytes[static_cast<int>(l)]);
    };
  };
  const auto hit = [](Tier t) { return [t](const BaselineResult& b) { return b.hit_rate(t); }; };
  const auto hinted_loads = [](Tier t) {
    return
        [t](const BaselineResult& b) { return static_cast<double>(b.hinted_loads[tier_index(t)]); };
  };
  const auto hinted_reuse = [](Tier t) {
    return [t](const BaselineResult& b) { return b.hinted_reuse(t); };
  };
  return {
      {"completed", "requests served",
       [](const BaselineResult& b) { return double(b.completed()); }, count},
      {"rejected", "requests rejected",
       [](const BaselineResult& b) { return double(b.rejected()); }, count},
      {"mean_ttft_ms", "TTFT mean (ms)", [](const BaselineResult& b) { return b.ttft_ms().mean; },
       ms},
      {"p50_ttft_ms", "TTFT p50 (ms)", [](const BaselineResult& b) { return b.ttft_ms().p50; }, ms},
      {"p90_ttft_ms", "TTFT p90 (ms)", [](const BaselineResult& b) { return b.ttft_ms().p90; }, ms},
      {"p99_ttft_ms", "TTFT p99 (ms)", [](const BaselineResult& b) { return b.ttft_ms().p99; }, ms},
      {"mean_tpot_ms", "TPOT mean (ms)", [](const BaselineResult& b) { return b.tpot_ms().mean; },
       ms},
      {"p50_tpot_ms", "TPOT p50 (ms)", [](const BaselineResult& b) { return b.tpot_ms().p50; }, ms},
      {"p90_tpot_ms", "TPOT p90 (ms)", [](const BaselineResult& b) { return b.tpot_ms().p90; }, ms},
      {"p99_tpot_ms", "TPOT p99 (ms)", [](const BaselineResult& b) { return b.tpot_ms().p99; }, ms},
      {"p50_e2e_ms", "end-to-end p50 (ms)", [](const BaselineResult& b) { return b.e2e_ms().p50; },
       ms},
      {"requests_per_s", "requests / s", [](const BaselineResult& b) { return b.requests_per_s(); },
       rate},
      {"output_tokens_per_s", "output tokens / s",
       [](const BaselineResult& b) { return b.output_tokens_per_s(); }, rate},
      {"total_tokens_per_s", "total tokens / s",
       [](const BaselineResult& b) { return b.total_tokens_per_s(); }, rate},
      {"duration_s", "duration (s)", [](const BaselineResult& b) { return b.duration_s(); }, secs},
      {"hit_rate_total", "hit rate, tokens", [](const BaselineResult& b) { return b.hit_rate(); },
       pct},
      {"hit_rate_hbm", "  from HBM", hit(Tier::kHbm), pct},
      {"hit_rate_host", "  from host", hit(Tier::kHost), pct},
      {"hit_rate_nvme", "  from NVMe", hit(Tier::kNvme), pct},
      {"prefill_gpu_s", "prefill GPU time (s)",
       [](const BaselineResult& b) { return nanos_to_seconds(b.prefill_gpu_ns); }, secs},
      {"prefill_tokens", "prompt tokens computed",
       [](const BaselineResult& b) { return double(b.prefill_tokens); }, count},
      {"stall_s", "stall (s)", [](const BaselineResult& b) { return nanos_to_seconds(b.stall_ns); },
       secs},
      {"stall_fraction", "stall / step time",
       [](const BaselineResult& b) { return b.stall_fraction(); }, pct},
      {"bytes_host_to_hbm", "bytes host->HBM", link_bytes(Link::kHostToHbm), bytes},
      {"bytes_hbm_to_host", "bytes HBM->host", link_bytes(Link::kHbmToHost), bytes},
      {"bytes_nvme_to_host", "bytes NVMe->host", link_bytes(Link::kNvmeToHost), bytes},
      {"bytes_host_to_nvme", "bytes host->NVMe", link_bytes(Link::kHostToNvme), bytes},
      {"prefetches", "prefetches", [](const BaselineResult& b) { return double(b.prefetches); },
       count},
      {"prefetch_timeliness", "prefetch on time",
       [](const BaselineResult& b) { return b.prefetch_timeliness(); }, pct},
      {"hinted_reads_nvme_to_host", "hinted NVMe reads (blocks)", hinted_loads(Tier::kHost), count},
      {"hinted_reads_reused", "  reused by a request", hinted_reuse(Tier::kHost), pct},
      {"hinted_loads_into_hbm", "hinted HBM loads (blocks)", hinted_loads(Tier::kHbm), count},
      {"hinted_loads_into_hbm_reused", "  reused by a request", hinted_reuse(Tier::kHbm), pct},
      {"recompute_instead_of_load_tokens", "recomputed, not loaded (tok)",
       [](const BaselineResult& b) { return double(b.recompute_tokens); }, count},
      {"steps", "scheduler steps", [](const BaselineResult& b) { return double(b.steps); }, count},
      {"windowed_steps", "  windowed",
       [](const BaselineResult& b) { return double(b.windowed_steps); }, count},
      {"wall_s", "wall time of the run (s)", [](const BaselineResult& b) { return b.wall_s; },
       secs},
  };
}

// TTFT mean and median of each part, when the workload has more than one.
struct PartColumn {
  std::string key;    // CSV
  std::string label;  // table
  std::function<double(const BaselineResult&)> get;
};

std::vector<PartColumn> part_columns(const RunReport& r) {
  std::vector<PartColumn> out;
  if (r.parts.size() < 2) return out;
  for (uint32_t k = 0; k < r.parts.size(); ++k) {
    const std::string& part = r.parts[k];
    out.push_back({"mean_ttft_ms_" + part, "TTFT mean, " + part + " (ms)",
                   [k](const BaselineResult& b) { return b.ttft_ms(k).mean; }});
    out.push_back({"p50_ttft_ms_" + part, "TTFT p50, " + part + " (ms)",
                   [k](const BaselineResult& b) { return b.ttft_ms(k).p50; }});
  }
  return out;
}

std::string pad(std::string s, std::size_t width, bool right) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

void comparison_lines(std::ostream& os, const RunReport& r) {
  const BaselineResult* kv = find(r, "kvtier");
  if (kv == nullptr) return;
  for (std::string_view other : {"recompute", "hbm_lru", "hbm_host"}) {
    const BaselineResult* o = find(r, other);
    if (o == nullptr) continue;
    const double ttft = ratio(kv->ttft_ms().p50, o->ttft_ms().p50);
    const double prefill =
        ratio(static_cast<double>(kv->prefill_gpu_ns), static_cast<double>(o->prefill_gpu_ns));
    os << "  kvtier vs " << pad(std::string(other), 9, false) << ": TTFT p50 x" << ratio_text(ttft)
       << ", prefill GPU time x" << ratio_text(prefill) << ", hit rate " << percent(kv->hit_rate())
       << " vs " << percent(o->hit_rate()) << "\n";
  }
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) {
    b /= 1000;
    ++u;
  }
  return fixed(b, b >= 100 || u == 0 ? 0 : 1) + " " + units[u];
}

void describe_workload(RunReport& r, const Workload& w) {
  r.workload = w.name;
  r.workload_description = w.description;
  r.requests = w.requests.size();
  r.input_tokens = w.total_input_tokens();
  r.output_tokens = w.total_output_tokens();
  r.longest_request_tokens = w.max_request_tokens();
  r.parts = w.kinds;
}

void print_table(std::ostream& os, const RunReport& r) {
  os << "kvtier-bench run (" << r.clock << " clock): " << r.gpu << ", " << r.model << "\n";
  os << "workload " << r.workload_description << ": " << r.requests << " requests, "
     << fixed(static_cast<double>(r.input_tokens) / 1e6, 2) << "M prompt tokens, "
     << fixed(static_cast<double>(r.output_tokens) / 1e6, 3) << "M output tokens, longest "
     << r.longest_request_tokens << " tokens; seed " << r.seed << "\n";
  os << "configuration: " << r.config_source << "\n";
  for (const std::string& n : r.notes) os << n << "\n";
  os << "\n";
  constexpr std::size_t kLabel = 30;
  constexpr std::size_t kCol = 15;
  os << pad("", kLabel, false);
  for (const BaselineResult& b : r.baselines) os << pad(b.name, kCol, true);
  os << "\n";
  os << pad("tiers", kLabel, false);
  for (const BaselineResult& b : r.baselines) {
    std::string t = "hbm";
    if (b.tier_bytes[tier_index(Tier::kHost)] > 0) t += "+host";
    if (b.tier_bytes[tier_index(Tier::kNvme)] > 0) t += "+nvme";
    os << pad(t, kCol, true);
  }
  os << "\n";
  for (const Column& c : columns()) {
    os << pad(std::string(c.label), kLabel, false);
    for (const BaselineResult& b : r.baselines) os << pad(c.show(c.get(b)), kCol, true);
    os << "\n";
    if (c.key != "p99_ttft_ms") continue;
    for (const PartColumn& p : part_columns(r)) {  // below the whole mix's TTFT
      os << pad(p.label, kLabel, false);
      for (const BaselineResult& b : r.baselines) os << pad(millis(p.get(b)), kCol, true);
      os << "\n";
    }
  }
  if (std::any_of(r.baselines.begin(), r.baselines.end(),
                  [](const BaselineResult& b) { return b.has_overlap; })) {
    const auto row = [&](std::string_view label, auto get) {
      os << pad(std::string(label), kLabel, false);
      for (const BaselineResult& b : r.baselines)
        os << pad(b.has_overlap ? get(b) : "-", kCol, true);
      os << "\n";
    };
    row("load demand (GB/s)", [](const BaselineResult& b) { return fixed(b.demand_gbps, 2); });
    row("link bandwidth (GB/s)", [](const BaselineResult& b) { return fixed(b.link_gbps, 2); });
    row("link achieved (GB/s)", [](const BaselineResult& b) { return fixed(b.achieved_gbps, 2); });
    row("transfer-only time (s)",
        [](const BaselineResult& b) { return fixed(b.transfer_only_s, 2); });
    row("transfer hidden by compute",
        [](const BaselineResult& b) { return percent(b.hidden_fraction); });
  }
  os << "\n";
  os << "What each tier bought (ratios < 1 are better for kvtier):\n";
  comparison_lines(os, r);
  for (const BaselineResult& b : r.baselines) {
    os << "  " << pad(b.name, 10, false) << " " << b.summary << "\n";
  }
}

void print_json(std::ostream& os, const RunReport& r) {
  Json j(os);
  j.begin_object();
  j.field("clock", r.clock);
  j.field("gpu", r.gpu);
  j.field("model", r.model);
  j.field("config", r.config_source);
  j.field("seed", r.seed);
  j.key("workload");
  j.begin_object();
  j.field("name", r.workload);
  j.field("description", r.workload_description);
  j.field("requests", r.requests);
  j.field("input_tokens", r.input_tokens);
  j.field("output_tokens", r.output_tokens);
  j.field("longest_request_tokens", r.longest_request_tokens);
  j.end_object();
  j.key("shape");
  j.begin_object();
  j.field("page_tokens", static_cast<uint64_t>(r.page_tokens));
  j.field("layers", static_cast<uint64_t>(r.layers));
  j.field("layer_group", static_cast<uint64_t>(r.layer_group));
  j.field("kv_bytes_per_token", r.kv_bytes_per_token);
  j.end_object();
  j.key("baselines");
  j.begin_array();
  for (const BaselineResult& b : r.baselines) {
    j.begin_object();
    j.field("name", b.name);
    j.field("summary", b.summary);
    j.field("requests", b.requests());
    for (const Column& c : columns()) {
      if (c.key.rfind("hit_rate_", 0) == 0) continue;  // nested below
      j.field(c.key, c.get(b));
    }
    j.key("hit_rate");
    j.begin_object();
    for (Tier t : kAllTiers) j.field(tier_name(t), b.hit_rate(t));
    j.field("total", b.hit_rate());
    j.end_object();
    j.key("hit_tokens");
    j.begin_object();
    for (Tier t : kAllTiers) j.field(tier_name(t), b.hit_tokens(t));
    j.field("prompt", b.input_tokens());
    j.end_object();
    j.key("tier_bytes");
    j.begin_object();
    for (Tier t : kAllTiers) j.field(tier_name(t), b.tier_bytes[tier_index(t)]);
    j.end_object();
    j.key("links");
    j.begin_object();
    for (Link l : kAllLinks) {
      j.key(link_name(l));
      j.begin_object();
      j.field("bytes", b.link_bytes[static_cast<int>(l)]);
      j.field("busy_s", b.link_busy_s[static_cast<int>(l)]);
      j.end_object();
    }
    j.end_object();
    j.key("pages_moved");
    j.begin_object();
    for (Tier t : kAllTiers) {
      j.key(tier_name(t));
      j.begin_object();
      j.field("promotions", b.promotions[tier_index(t)]);
      j.field("demotions", b.demotions[tier_index(t)]);
      j.field("evictions", b.evictions[tier_index(t)]);
      j.end_object();
    }
    j.end_object();
    j.key("ttft_ms_by_part");
    j.begin_object();
    for (uint32_t k = 0; k < r.parts.size(); ++k) {
      const LatencySummary t = b.ttft_ms(k);
      j.key(r.parts[k]);
      j.begin_object();
      j.field("count", t.count);
      j.field("mean", t.mean);
      j.field("p50", t.p50);
      j.field("p90", t.p90);
      j.field("p99", t.p99);
      j.end_object();
    }
    j.end_object();
    j.field("late_prefetches", b.late_prefetches);
    j.field("compute_s", nanos_to_seconds(b.compute_ns));
    if (b.has_overlap) {
      j.field("transfer_only_s", b.transfer_only_s);
      j.field("hidden_fraction", b.hidden_fraction);
      j.field("demand_gbps", b.demand_gbps);
      j.field("link_gbps", b.link_gbps);
      j.field("achieved_gbps", b.achieved_gbps);
    }
    j.end_object();
  }
  j.end_array();
  j.key("comparison");
  j.begin_object();
  if (const BaselineResult* kv = find(r, "kvtier")) {
    for (std::string_view other : {"recompute", "hbm_lru", "hbm_host"}) {
      const BaselineResult* o = find(r, other);
      if (o == nullptr) continue;
      j.key("kvtier_vs_" + std::string(other));
      j.begin_object();
      j.field("p50_ttft_ratio", ratio(kv->ttft_ms().p50, o->ttft_ms().p50));
      j.field("mean_ttft_ratio", ratio(kv->ttft_ms().mean, o->ttft_ms().mean));
      j.field("prefill_gpu_ratio", ratio(static_cast<double>(kv->prefill_gpu_ns),
                                         static_cast<double>(o->prefill_gpu_ns)));
      j.field("hit_rate_gain", kv->hit_rate() - o->hit_rate());
      j.end_object();
    }
  }
  j.end_object();
  j.end_object();
  os << "\n";
}

void print_csv(std::ostream& os, const RunReport& r) {
  const std::vector<PartColumn> parts = part_columns(r);
  os << "name";
  for (const Column& c : columns()) os << "," << c.key;
  for (const PartColumn& c : parts) os << "," << c.key;
  os << "\n";
  const auto field = [&os](double v) {
    os << ",";
    if (std::isfinite(v)) os << std::setprecision(10) << v;
  };
  for (const BaselineResult& b : r.baselines) {
    os << b.name;
    for (const Column& c : columns()) field(c.get(b));
    for (const PartColumn& c : parts) field(c.get(b));
    os << "\n";
  }
}

namespace {

// `text` as a gnuplot single-quoted string: there a quote is written twice and nothing else is
// special (no backslash escapes, no backquote or macro substitution). A line break would end the
// command, so control characters become spaces (titles; check_plot_path refuses them in paths).
std::string gnuplot_string(std::string_view text) {
  std::string s = "'";
  for (const char c : text) {
    if (c == '\'') {
      s += "''";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      s += ' ';
    } else {
      s += c;
    }
  }
  return s + "'";
}

}  // namespace

Status check_plot_path(const std::string& path) {
  if (path.empty()) return invalid_argument("--plot needs a file name, e.g. --plot run.png");
  for (const char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return invalid_argument("--plot " + gnuplot_string(path) +
                              ": the file name contains a control character (a line break or "
                              "tab), which gnuplot cannot take; choose another name");
    }
  }
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode)) {
    return invalid_argument("--plot " + path +
                            " is a directory; give the PNG file to write, e.g. --plot " +
                            (path.back() == '/' ? path : path + "/") + "run.png");
  }
  if (existed && !S_ISREG(st.st_mode)) {
    return invalid_argument("--plot " + path + " is not a regular file");
  }
  // Opened without truncation: an existing plot survives a run that fails before drawing.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return invalid_argument("--plot " + path + ": cannot " + (existed ? "write" : "create") +
                            " it: " + std::strerror(errno));
  }
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
  if (!program_on_path("gnuplot")) {
    return unavailable("--plot needs gnuplot, which is not installed (Debian package gnuplot-nox)");
  }
  return ok_status();
}

Status write_plot(const std::string& path, const RunReport& r) {
  KVTIER_RETURN_IF_ERROR(check_plot_path(path));
  // Absolute, so gnuplot's expansion of a leading "~" cannot send the plot elsewhere.
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  const std::string target = ec ? path : absolute.string();
  std::ostringstream script;
  script << "set terminal pngcairo size 1400,560 font 'sans,11'\n"
         << "set output " << gnuplot_string(target) << "\n"
         << "set multiplot layout 1,2 title "
         << gnuplot_string("kvtier-bench run: " + r.workload + " on " + r.gpu) << " noenhanced\n"
         << "set style data histograms\nset style fill solid 0.85 border -1\nset boxwidth 0.8\n"
         << "set termoption noenhanced\nset grid ytics\nset key outside bottom center horizontal\n";
  // Baseline names are words of make_baselines (no spaces or quotes): safe as data columns.
  script << "$hits << EOD\n";
  for (const BaselineResult& b : r.baselines) {
    script << b.name << " " << 100 * b.hit_rate(Tier::kHbm) << " " << 100 * b.hit_rate(Tier::kHost)
           << " " << 100 * b.hit_rate(Tier::kNvme) << "\n";
  }
  script << "EOD\n$ttft << EOD\n";
  for (const BaselineResult& b : r.baselines) {
    const LatencySummary t = b.ttft_ms();
    script << b.name << " " << std::max(t.p50, 1e-3) << " " << std::max(t.p90, 1e-3) << " "
           << std::max(t.p99, 1e-3) << "\n";
  }
  script
      << "EOD\n"
      << "set title 'Prompt tokens reused, by tier (%)'\nset style histogram rowstacked\n"
      << "set yrange [0:100]\nset ylabel '% of prompt tokens'\n"
      << "plot $hits using 2:xtic(1) title 'HBM' lc rgb '#2b8cbe', '' using 3 title 'host' "
         "lc rgb '#7bccc4', '' using 4 title 'NVMe' lc rgb '#bae4bc'\n"
      << "set title 'Time to first token (ms, log scale)'\nset style histogram clustered gap 1\n"
      << "set autoscale y\nset logscale y\nset ylabel 'ms'\n"
      << "plot $ttft using 2:xtic(1) title 'p50' lc rgb '#31a354', '' using 3 title 'p90' lc rgb "
         "'#fd8d3c', '' using 4 title 'p99' lc rgb '#de2d26'\n"
      << "unset multiplot\n";
  // gnuplot's stdout goes to /dev/null: when it cannot open the output it draws to stdout, which
  // carries the table or the JSON.
  auto run = run_program({"gnuplot"}, script.str(), /*capture_stdout=*/false);
  if (!run.ok()) {
    if (run.status().code() == StatusCode::kNotFound) {
      return unavailable(
          "gnuplot is not installed (Debian package gnuplot-nox); no plot written to " + path);
    }
    return run.status().with_context("--plot " + path);
  }
  if (!run->ok())
    return internal_error("gnuplot failed drawing " + path + " (" + run->describe() + ")");
  struct stat st {};
  if (::stat(target.c_str(), &st) != 0 || st.st_size == 0) {
    return internal_error("gnuplot wrote nothing to " + path +
                          (run->err.empty() ? std::string() : " (" + run->describe() + ")"));
  }
  return ok_status();
}

}  // namespace kvtier::bench::run
