// A real Prometheus server (Debian's /usr/bin/prometheus) scrapes the exporter on loopback with a
// temporary copy of configs/prometheus.yml (the exporter's port, a 250 ms scrape interval, a
// temporary TSDB), while a driver moves the counters at known per-tier hit ratios. Through
// Prometheus's HTTP API the test checks the per-tier hit rate the dashboard computes, the exact
// totals once the driver stops, and that every query of configs/grafana/kvtier.json evaluates.
// A second test lets it scrape a real benchmark run (`kvtier-bench run --metrics`) and checks its
// last scrape against the run's JSON report (steps, pages moved, hits) and the per-tier hit rate
// it computes. The server is started and stopped (SIGTERM, then SIGKILL; always reaped) by the
// test itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/metrics_exporter.hpp"
#include "tests/runtime/config_test_util.hpp"
#include "tests/runtime/metrics_test_util.hpp"

namespace kvtier {
namespace {

using ::kvtier::testing::Json;
using Clock = std::chrono::steady_clock;

constexpr const char* kScrapeInterval = "250ms";
// Token hit ratios the driver keeps exactly: of every 100 tokens looked up, 50 hit in HBM, 30 in
// host, 10 on NVMe (and 10 miss).
const std::map<std::string, double> kHitShare = {{"hbm", 0.5}, {"host", 0.3}, {"nvme", 0.1}};

// The exported counters, moved in lockstep by a driver thread.
class Workload {
 public:
  MetricsSources sources() {
    MetricsSources s;
    s.scheduler = &scheduler_;
    s.transfer = &transfer_;
    s.occupancy[tier_index(Tier::kHbm)] = [this] {
      return TierOccupancy{used_.load(std::memory_order_relaxed), 1 << 30};
    };
    return s;
  }

  void start() {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        for (int i = 0; i < 10; ++i) step();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ~Workload() { stop(); }

  uint64_t steps() const { return steps_.load(); }
  // Gauges of NVMe trouble: drives out of service, requests a hung drive holds.
  void drive_trouble(uint64_t out_of_service, uint64_t unanswered) {
    transfer_.files_out_of_service.store(out_of_service);
    transfer_.requests_unanswered.store(unanswered);
  }

 private:
  void step() {
    scheduler_.lookup_tokens.fetch_add(100, std::memory_order_relaxed);
    scheduler_.lookup_blocks.fetch_add(10, std::memory_order_relaxed);
    for (const Tier t : kAllTiers) {
      const auto tokens = static_cast<uint64_t>(kHitShare.at(std::string(tier_name(t))) * 100);
      scheduler_.hit_tokens[tier_index(t)].fetch_add(tokens, std::memory_order_relaxed);
      scheduler_.hit_blocks[tier_index(t)].fetch_add(tokens / 10, std::memory_order_relaxed);
    }
    scheduler_.evictions[tier_index(Tier::kHbm)].fetch_add(1, std::memory_order_relaxed);
    scheduler_.stall_nanos.fetch_add(20'000, std::memory_order_relaxed);
    for (const Link l : kAllLinks) {
      LinkStats& s = transfer_.link(l);
      s.bytes.fetch_add(65536, std::memory_order_relaxed);
      s.ops.fetch_add(1, std::memory_order_relaxed);
      s.latency.record(150'000);
    }
    used_.fetch_add(4096, std::memory_order_relaxed);
    steps_.fetch_add(1);
  }

  SchedulerStats scheduler_;
  TransferStats transfer_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> steps_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One instant-query answer: status, and the vector's samples as {labels, value}.
struct QueryResult {
  bool ok = false;
  std::string raw;
  std::vector<std::pair<std::map<std::string, std::string>, double>> samples;
};

QueryResult query(uint16_t port, const std::string& promql) {
  QueryResult out;
  const testing::HttpResponse r =
      testing::http_get(port, "/api/v1/query?query=" + testing::url_encode(promql));
  out.raw = r.error + r.body;
  std::string error;
  const std::optional<Json> j = testing::JsonReader::parse(r.body, &error);
  if (r.status != 200 || !j || j->str("status") != "success") return out;
  const Json* data = j->get("data");
  if (data == nullptr || data->get("result") == nullptr) return out;
  out.ok = true;
  if (data->str("resultType") != "vector") return out;
  for (const Json& s : data->get("result")->array) {
    std::map<std::string, std::string> labels;
    if (const Json* m = s.get("metric"); m != nullptr) {
      for (const auto& [k, v] : m->object) labels[k] = v.string;
    }
    const Json* value = s.get("value");
    if (value == nullptr || value->array.size() != 2) continue;
    // Prometheus writes sample values as strings ("0.5", "NaN").
    out.samples.emplace_back(labels, std::strtod(value->array[1].string.c_str(), nullptr));
  }
  return out;
}

// Polls `done` every 100 ms until it holds or `limit` passes.
template <typename F>
bool eventually(std::chrono::milliseconds limit, F done) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// configs/prometheus.yml, aimed at `target_port`, scraping and evaluating its rules every
// kScrapeInterval.
std::string test_prometheus_config(uint16_t target_port) {
  const std::string original = testing::read_text(testing::source_dir() / "configs/prometheus.yml");
  const std::string target = "\"" + MetricsConfig{}.listen + "\"";
  EXPECT_NE(original.find(target), std::string::npos)
      << "configs/prometheus.yml no longer scrapes " << target;
  std::istringstream in(original);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    for (const std::string key : {"scrape_interval:", "evaluation_interval:"}) {
      if (const std::size_t at = line.find(key); at != std::string::npos) {
        line = line.substr(0, at) + key + " " + kScrapeInterval;
      }
    }
    if (const std::size_t at = line.find(target); at != std::string::npos) {
      line.replace(at, target.size(), "\"127.0.0.1:" + std::to_string(target_port) + "\"");
    }
    out += line + "\n";
  }
  return out;
}

// The dashboard's queries with Grafana's variables filled in as Grafana would for "All".
std::vector<std::pair<std::string, std::string>> dashboard_queries() {
  std::string error;
  const std::optional<Json> d = testing::JsonReader::parse(
      testing::read_text(testing::source_dir() / "configs/grafana/kvtier.json"), &error);
  EXPECT_TRUE(d.has_value()) << error;
  std::vector<std::pair<std::string, std::string>> out;
  if (!d || d->get("panels") == nullptr) return out;
  for (const Json& p : d->get("panels")->array) {
    const Json* targets = p.get("targets");
    if (targets == nullptr) continue;
    for (const Json& t : targets->array) {
      std::string expr = t.str("expr");
      for (auto [var, value] :
           {std::pair<std::string, std::string>{"$__rate_interval", "2s"}, {"$instance", ".*"}}) {
        for (std::size_t at; (at = expr.find(var)) != std::string::npos;) {
          expr.replace(at, var.size(), value);
        }
      }
      out.emplace_back(p.str("title"), expr);
    }
  }
  return out;
}

// A Prometheus server started by a test on a free loopback port, scraping what `config_path`
// names; stopped (SIGTERM, then SIGKILL; always reaped) when it goes out of scope.
struct PrometheusServer {
  std::unique_ptr<testing::ChildProcess> process;
  uint16_t api_port = 0;
  std::string log_path;
  std::string log() const { return "prometheus log:\n" + testing::read_text(log_path); }
};

// Starts the server and waits until it is ready (test failures otherwise; call under
// ASSERT_NO_FATAL_FAILURE).
void start_prometheus(const std::string& prometheus, const testing::TempDir& dir,
                      uint16_t target_port, PrometheusServer& out) {
  const std::string config_path = dir.write("prometheus.yml", test_prometheus_config(target_port));
  // The rules file the configuration names, beside it as in configs/.
  dir.write("prometheus-alerts.yml",
            testing::read_text(testing::source_dir() / "configs/prometheus-alerts.yml"));
  out.log_path = (dir.path() / "prometheus.log").string();
  // The API port is picked free just before the server binds it; should another process take it
  // in between, the server exits and the next attempt picks another.
  for (int attempt = 0; attempt < 3 && !out.process; ++attempt) {
    out.api_port = testing::free_loopback_port();
    ASSERT_NE(out.api_port, 0);
    auto child = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{prometheus, "--config.file=" + config_path,
                                 "--storage.tsdb.path=" + (dir.path() / "tsdb").string(),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(out.api_port),
                                 "--log.level=warn"},
        out.log_path);
    ASSERT_TRUE(child->started());
    bool exited = false;
    const bool ready = eventually(std::chrono::seconds(20), [&] {
      exited = !child->running();
      return exited || testing::http_get(out.api_port, "/-/ready").status == 200;
    });
    ASSERT_TRUE(ready) << "prometheus did not become ready\n" << out.log();
    if (!exited) out.process = std::move(child);
  }
  ASSERT_TRUE(out.process) << "prometheus exited at start three times\n" << out.log();
}

// Whether the server has scraped its kvtier target successfully within `limit`.
bool target_up(const PrometheusServer& server, std::chrono::milliseconds limit) {
  return eventually(limit, [&] {
    const QueryResult up = query(server.api_port, "up{job=\"kvtier\"}");
    return up.ok && up.samples.size() == 1 && up.samples[0].second == 1;
  });
}

TEST(MetricsPrometheus, RealServerScrapesAndComputesPerTierHitRates) {
  const std::string prometheus = testing::find_executable("prometheus");
  if (prometheus.empty()) GTEST_SKIP() << "prometheus not found (Debian package prometheus)";

  Workload work;
  MetricsConfig config;
  config.listen = "127.0.0.1:0";
  auto exporter = MetricsExporter::create(config, work.sources());
  ASSERT_TRUE(exporter.ok()) << exporter.status().to_string();
  ASSERT_TRUE((*exporter)->serving());

  testing::TempDir dir;
  PrometheusServer server;
  ASSERT_NO_FATAL_FAILURE(start_prometheus(prometheus, dir, (*exporter)->port(), server));
  const uint16_t api_port = server.api_port;
  auto server_log = [&] { return server.log(); };
  ASSERT_TRUE(target_up(server, std::chrono::seconds(10))) << "the kvtier target never came up\n"
                                                           << server_log();

  // Counters move for a few seconds (a dozen scrapes); the per-tier token hit rate over that
  // window, as the dashboard's first panel computes it, must be the driver's ratios. The ratio of
  // two rates taken from the same scrapes does not depend on timing; a scrape that lands between
  // a step's lookup and hit increments skews it by at most one step out of thousands.
  work.start();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const std::vector<std::pair<std::string, std::string>> queries = dashboard_queries();
  ASSERT_FALSE(queries.empty());
  ASSERT_EQ(queries[0].first, "Hit rate by tier (tokens)");
  const std::string& hit_rate = queries[0].second;
  QueryResult rates;
  ASSERT_TRUE(eventually(std::chrono::seconds(5),
                         [&] {
                           rates = query(api_port, hit_rate);
                           return rates.ok && rates.samples.size() == kHitShare.size();
                         }))
      << hit_rate << "\n"
      << rates.raw << "\n"
      << server_log();
  for (const auto& [labels, value] : rates.samples) {
    ASSERT_TRUE(labels.count("tier")) << rates.raw;
    EXPECT_NEAR(value, kHitShare.at(labels.at("tier")), 0.01) << "tier " << labels.at("tier");
  }

  // Every dashboard query parses and evaluates against the live data.
  for (const auto& [panel, expr] : queries) {
    const QueryResult r = query(api_port, expr);
    EXPECT_TRUE(r.ok) << panel << ": " << expr << "\n" << r.raw;
    EXPECT_FALSE(r.samples.empty()) << panel << ": " << expr << "\n" << r.raw;
  }

  // Once the counters stop, the next scrape carries the exact totals.
  work.stop();
  const double steps = static_cast<double>(work.steps());
  ASSERT_GT(steps, 0);
  ASSERT_TRUE(eventually(std::chrono::seconds(5),
                         [&] {
                           const QueryResult r = query(api_port, "kvtier_lookup_tokens_total");
                           return r.ok && r.samples.size() == 1 &&
                                  r.samples[0].second == 100 * steps;
                         }))
      << "Prometheus never saw the final lookup count " << 100 * steps << "\n"
      << server_log();
  for (const auto& [tier, share] : kHitShare) {
    const QueryResult r = query(api_port, "kvtier_hit_tokens_total{tier=\"" + tier + "\"}");
    ASSERT_TRUE(r.ok && r.samples.size() == 1) << r.raw;
    EXPECT_EQ(r.samples[0].second, share * 100 * steps) << tier;
  }
  const QueryResult bytes =
      query(api_port, "kvtier_transfer_bytes_total{src=\"nvme\",dst=\"host\"}");
  ASSERT_TRUE(bytes.ok && bytes.samples.size() == 1) << bytes.raw;
  EXPECT_EQ(bytes.samples[0].second, 65536 * steps);

  server.process->stop();
  EXPECT_FALSE(server.process->running());
}

// The `data` member of a successful answer of the HTTP API at `path`, or nothing.
std::optional<Json> api_data(uint16_t port, const std::string& path) {
  const testing::HttpResponse r = testing::http_get(port, path);
  std::string error;
  std::optional<Json> j = testing::JsonReader::parse(r.body, &error);
  if (r.status != 200 || !j || j->str("status") != "success" || j->get("data") == nullptr) {
    return std::nullopt;
  }
  return *j->get("data");
}

// configs/prometheus-alerts.yml on a real server: every rule loads and evaluates without error,
// and with one drive out of service and two requests unanswered exactly those two alerts are
// active (pending, since their `for` has not passed), no other.
TEST(MetricsPrometheus, AlertRulesEvaluateAndTheDriveAlertsFire) {
  const std::string prometheus = testing::find_executable("prometheus");
  if (prometheus.empty()) GTEST_SKIP() << "prometheus not found (Debian package prometheus)";
  Workload work;
  work.drive_trouble(1, 2);
  MetricsConfig config;
  config.listen = "127.0.0.1:0";
  auto exporter = MetricsExporter::create(config, work.sources());
  ASSERT_TRUE(exporter.ok()) << exporter.status().to_string();
  testing::TempDir dir;
  PrometheusServer server;
  ASSERT_NO_FATAL_FAILURE(start_prometheus(prometheus, dir, (*exporter)->port(), server));
  ASSERT_TRUE(target_up(server, std::chrono::seconds(10))) << server.log();

  const std::set<std::string> rules = {"KvtierDown",
                                       "KvtierNvmeDriveOutOfService",
                                       "KvtierNvmeRequestsUnanswered",
                                       "KvtierNvmeWritesPaused",
                                       "KvtierNvmeReadsPaused",
                                       "KvtierNvmeChecksumFailures"};
  std::set<std::string> healthy;
  std::string last;
  ASSERT_TRUE(eventually(std::chrono::seconds(10),
                         [&] {
                           healthy.clear();
                           const std::optional<Json> data =
                               api_data(server.api_port, "/api/v1/rules");
                           if (!data || data->get("groups") == nullptr) return false;
                           last.clear();
                           for (const Json& group : data->get("groups")->array) {
                             if (group.get("rules") == nullptr) continue;
                             for (const Json& rule : group.get("rules")->array) {
                               last += rule.str("name") + ": " + rule.str("health") + " " +
                                       rule.str("lastError") + "\n";
                               if (rule.str("health") == "ok") healthy.insert(rule.str("name"));
                             }
                           }
                           return healthy == rules;
                         }))
      << last << server.log();

  const std::set<std::string> expected = {"KvtierNvmeDriveOutOfService",
                                          "KvtierNvmeRequestsUnanswered"};
  std::set<std::string> active;
  ASSERT_TRUE(eventually(std::chrono::seconds(10),
                         [&] {
                           active.clear();
                           const std::optional<Json> data =
                               api_data(server.api_port, "/api/v1/alerts");
                           if (!data || data->get("alerts") == nullptr) return false;
                           for (const Json& alert : data->get("alerts")->array) {
                             const Json* labels = alert.get("labels");
                             if (labels == nullptr) continue;
                             active.insert(labels->str("alertname"));
                             EXPECT_EQ(alert.str("state"), "pending") << labels->str("alertname");
                           }
                           return active == expected;
                         }))
      << ::testing::PrintToString(active) << "\n"
      << server.log();
  server.process->stop();
}

#ifdef KVTIER_BENCH_PATH
// A number of the benchmark's JSON report: baselines[0].<path...>.
double report_number(const Json& report, std::initializer_list<std::string_view> path) {
  const Json* v = report.get("baselines");
  if (v == nullptr || v->array.empty()) return -1;
  v = &v->array[0];
  for (std::string_view key : path) {
    v = v->get(key);
    if (v == nullptr) return -1;
  }
  return v->number;
}

// The last value Prometheus scraped for `series` (one sample), or -1. Through last_over_time: once
// the benchmark has exited, a failed scrape marks its series stale and a plain instant query
// returns nothing, while range selectors skip staleness markers.
double last_value(uint16_t api_port, const std::string& series) {
  const QueryResult r = query(api_port, "last_over_time(" + series + "[10m])");
  return r.ok && r.samples.size() == 1 ? r.samples[0].second : -1;
}

TEST(MetricsPrometheus, RealServerScrapesAKvtierBenchRun) {
  const std::string prometheus = testing::find_executable("prometheus");
  if (prometheus.empty()) GTEST_SKIP() << "prometheus not found (Debian package prometheus)";

  // `kvtier-bench run --metrics` on a port Prometheus is told to scrape; a chat workload that
  // overflows HBM and host memory (hits in every tier), held 2 s after the run for a last scrape.
  testing::TempDir dir;
  const uint16_t bench_port = testing::free_loopback_port();
  ASSERT_NE(bench_port, 0);
  PrometheusServer server;
  ASSERT_NO_FATAL_FAILURE(start_prometheus(prometheus, dir, bench_port, server));
  const std::string out_path = (dir.path() / "run.json").string();
  const std::string err_path = (dir.path() / "run.err").string();
  testing::ChildProcess bench({KVTIER_BENCH_PATH, "run",
                               "--baselines",     "kvtier",
                               "--workload",      "chat",
                               "--params",        "users=30,turns=4",
                               "--hbm",           "1GB",
                               "--host",          "2GB",
                               "--nvme",          "8GB",
                               "--json",          "--no-progress",
                               "--metrics",       "127.0.0.1:" + std::to_string(bench_port),
                               "--metrics-hold",  "2"},
                              out_path, "/dev/null", err_path);
  ASSERT_TRUE(bench.started());
  EXPECT_TRUE(target_up(server, std::chrono::seconds(30)))
      << "Prometheus never scraped the benchmark\n"
      << testing::read_text(err_path) << server.log();
  ASSERT_EQ(bench.wait_exit(std::chrono::seconds(240)), 0) << testing::read_text(err_path);
  EXPECT_THAT(testing::read_text(err_path),
              ::testing::HasSubstr("serves its metrics at http://127.0.0.1:" +
                                   std::to_string(bench_port) + "/metrics"));
  std::string error;
  const std::optional<Json> report =
      testing::JsonReader::parse(testing::read_text(out_path), &error);
  ASSERT_TRUE(report.has_value()) << error << "\n" << testing::read_text(out_path);

  // Counters the report reads from the same scheduler: Prometheus's last scrape has them exactly.
  const double steps = report_number(*report, {"steps"});
  ASSERT_GT(steps, 0);
  EXPECT_EQ(last_value(server.api_port, "kvtier_steps_total"), steps) << server.log();
  for (const char* tier : {"hbm", "host", "nvme"}) {
    for (const char* moved : {"promotions", "demotions", "evictions"}) {
      EXPECT_EQ(last_value(server.api_port,
                           std::string("kvtier_") + moved + "_total{tier=\"" + tier + "\"}"),
                report_number(*report, {"pages_moved", tier, moved}))
          << moved << " " << tier;
    }
  }
  // Hits: the scheduler counts every block a prompt matched; the report the ones reused, the rest
  // being recomputed because loading them was slower.
  double report_hits = 0, prometheus_hits = 0;
  for (const char* tier : {"hbm", "host", "nvme"}) {
    report_hits += report_number(*report, {"hit_tokens", tier});
    prometheus_hits +=
        last_value(server.api_port, std::string("kvtier_hit_tokens_total{tier=\"") + tier + "\"}");
  }
  EXPECT_EQ(prometheus_hits,
            report_hits + report_number(*report, {"recompute_instead_of_load_tokens"}));

  // The per-tier token hit rate over the whole run, computed by Prometheus from the counters.
  const QueryResult rates =
      query(server.api_port,
            "sum by (tier) (last_over_time(kvtier_hit_tokens_total[10m])) / ignoring(tier) "
            "group_left() sum(last_over_time(kvtier_lookup_tokens_total[10m]))");
  ASSERT_TRUE(rates.ok) << rates.raw;
  ASSERT_EQ(rates.samples.size(), 3u) << rates.raw;
  const double lookups = last_value(server.api_port, "kvtier_lookup_tokens_total");
  double total = 0;
  for (const auto& [labels, value] : rates.samples) {
    const std::string tier = labels.count("tier") ? labels.at("tier") : "";
    const double hits =
        last_value(server.api_port, "kvtier_hit_tokens_total{tier=\"" + tier + "\"}");
    EXPECT_GT(value, 0.0) << tier << ": the workload has hits in every tier";
    EXPECT_DOUBLE_EQ(value, hits / lookups) << tier;
    total += value;
  }
  EXPECT_LE(total, 1.0);
}
#endif  // KVTIER_BENCH_PATH

}  // namespace
}  // namespace kvtier
