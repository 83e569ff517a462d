// The metrics exporter on its own: families and values read at scrape time, /metrics over real
// HTTP while counters move, promtool's lint, a busy port, bad addresses, and a real tier stack's
// occupancy and transfers.
#include "runtime/metrics_exporter.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/log.hpp"
#include "runtime/metrics_tiers.hpp"
#include "tests/runtime/config_test_util.hpp"
#include "tests/runtime/metrics_test_util.hpp"
#include "tiers/frame_arena.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

using ::kvtier::testing::http_get;
using ::kvtier::testing::sample_value;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Collects log lines for the duration of a test, then restores stderr.
class LogCapture {
 public:
  LogCapture() {
    set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~LogCapture() { set_log_sink({}); }

  std::vector<std::string> at(LogLevel level) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [l, m] : lines_) {
      if (l == level) out.push_back(m);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

// Counters as a runtime would own them, with occupancy probes over plain atomics.
struct FakeRuntime {
  SchedulerStats scheduler;
  TransferStats transfer;
  std::atomic<uint64_t> hbm_used{0};
  std::atomic<uint64_t> host_used{0};
  static constexpr uint64_t kHbmCapacity = 1 << 20;
  static constexpr uint64_t kHostCapacity = 4 << 20;

  MetricsSources sources() {
    MetricsSources s;
    s.scheduler = &scheduler;
    s.transfer = &transfer;
    s.occupancy[tier_index(Tier::kHbm)] = [this] {
      return TierOccupancy{hbm_used.load(), kHbmCapacity};
    };
    s.occupancy[tier_index(Tier::kHost)] = [this] {
      return TierOccupancy{host_used.load(), kHostCapacity};
    };
    return s;
  }

  // One engine step's worth of counting: 4 blocks (64 tokens) looked up, 2 hit in HBM and 1 in
  // host, one 4 KiB host->hbm transfer of 3 us.
  void step() {
    scheduler.lookup_blocks.fetch_add(4, std::memory_order_relaxed);
    scheduler.lookup_tokens.fetch_add(64, std::memory_order_relaxed);
    scheduler.hit_blocks[tier_index(Tier::kHbm)].fetch_add(2, std::memory_order_relaxed);
    scheduler.hit_tokens[tier_index(Tier::kHbm)].fetch_add(32, std::memory_order_relaxed);
    scheduler.hit_blocks[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
    scheduler.hit_tokens[tier_index(Tier::kHost)].fetch_add(16, std::memory_order_relaxed);
    scheduler.steps.fetch_add(1, std::memory_order_relaxed);
    scheduler.stall_nanos.fetch_add(1000, std::memory_order_relaxed);
    LinkStats& link = transfer.link(Link::kHostToHbm);
    link.bytes.fetch_add(4096, std::memory_order_relaxed);
    link.ops.fetch_add(1, std::memory_order_relaxed);
    link.latency.record(3000);
    hbm_used.fetch_add(4096, std::memory_order_relaxed);
  }
};

MetricsConfig local_config(std::string listen = "127.0.0.1:0") {
  MetricsConfig c;
  c.listen = std::move(listen);
  c.latency_buckets = {2e-6, 4e-6, 0.001};
  return c;
}

std::unique_ptr<MetricsExporter> make_exporter(const MetricsConfig& c, MetricsSources s) {
  auto e = MetricsExporter::create(c, std::move(s));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

double value_or_nan(std::string_view text, std::string_view series) {
  return sample_value(text, series).value_or(std::nan(""));
}

TEST(MetricsExporter, ExportsTheDesignedFamilies) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(""), rt.sources());
  ASSERT_TRUE(e);
  const std::vector<std::string> names = testing::family_names(e->scrape_text());
  for (const char* want : {"kvtier_build_info",
                           "kvtier_lookup_blocks_total",
                           "kvtier_lookup_tokens_total",
                           "kvtier_hit_blocks_total",
                           "kvtier_hit_tokens_total",
                           "kvtier_transfer_bytes_total",
                           "kvtier_transfer_ops_total",
                           "kvtier_transfer_latency_seconds",
                           "kvtier_tier_used_bytes",
                           "kvtier_tier_capacity_bytes",
                           "kvtier_evictions_total",
                           "kvtier_shadowed_evictions_total",
                           "kvtier_promotions_total",
                           "kvtier_demotions_total",
                           "kvtier_late_prefetches_total",
                           "kvtier_hinted_loads_total",
                           "kvtier_hinted_loads_reused_total",
                           "kvtier_stall_seconds_total",
                           "kvtier_io_errors_total",
                           "kvtier_checksum_failures_total",
                           "kvtier_recompute_tokens_total",
                           "kvtier_deadline_misses_total",
                           "kvtier_failed_loads_total",
                           "kvtier_refused_demotions_total",
                           "kvtier_nvme_write_pauses_total",
                           "kvtier_nvme_writes_paused",
                           "kvtier_nvme_read_pauses_total",
                           "kvtier_nvme_reads_paused",
                           "kvtier_host_frames_held",
                           "kvtier_nvme_blocks_lost_total",
                           "kvtier_nvme_files_out_of_service",
                           "kvtier_nvme_probes_total",
                           "kvtier_nvme_files_readmitted_total",
                           "kvtier_nvme_files_replaced_total",
                           "kvtier_nvme_io_timeouts_total",
                           "kvtier_nvme_requests_unanswered",
                           "kvtier_link_queued_bytes",
                           "kvtier_link_inflight_bytes"}) {
    EXPECT_THAT(names, Contains(want));
  }
  // Hit rates are derived from counters, never exported as a ratio.
  for (const std::string& n : names) EXPECT_THAT(n, Not(HasSubstr("rate"))) << n;
}

TEST(MetricsExporter, ValuesAreTheCountersAtScrapeTime) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(""), rt.sources());
  ASSERT_TRUE(e);
  for (int i = 0; i < 5; ++i) rt.step();
  rt.scheduler.evictions[tier_index(Tier::kNvme)] = 7;
  rt.scheduler.shadowed_evictions[tier_index(Tier::kNvme)] = 4;
  rt.scheduler.recompute_tokens = 48;
  rt.scheduler.hinted_loads[tier_index(Tier::kHost)] = 9;
  rt.scheduler.hinted_loads_reused[tier_index(Tier::kHost)] = 5;
  rt.scheduler.link_queued_bytes[static_cast<int>(Link::kNvmeToHost)][1] = 6 << 20;
  rt.scheduler.link_queued_bytes[static_cast<int>(Link::kNvmeToHost)][2] = 40 << 20;
  rt.scheduler.link_inflight_bytes[static_cast<int>(Link::kNvmeToHost)] = 2 << 20;
  rt.transfer.checksum_failures = 2;
  rt.transfer.link(Link::kHostToNvme).errors = 3;
  rt.transfer.link(Link::kHostToNvme).cancelled = 1;
  const std::string t = e->scrape_text();
  EXPECT_EQ(value_or_nan(t, "kvtier_lookup_tokens_total"), 320);
  EXPECT_EQ(value_or_nan(t, "kvtier_hit_tokens_total{tier=\"hbm\"}"), 160);
  EXPECT_EQ(value_or_nan(t, "kvtier_hit_tokens_total{tier=\"host\"}"), 80);
  EXPECT_EQ(value_or_nan(t, "kvtier_hit_tokens_total{tier=\"nvme\"}"), 0);
  EXPECT_EQ(value_or_nan(t, "kvtier_hit_blocks_total{tier=\"hbm\"}"), 10);
  EXPECT_EQ(value_or_nan(t, "kvtier_evictions_total{tier=\"nvme\"}"), 7);
  EXPECT_EQ(value_or_nan(t, "kvtier_shadowed_evictions_total{tier=\"nvme\"}"), 4);
  EXPECT_EQ(value_or_nan(t, "kvtier_recompute_tokens_total"), 48);
  EXPECT_EQ(value_or_nan(t, "kvtier_hinted_loads_total{tier=\"host\"}"), 9);
  EXPECT_EQ(value_or_nan(t, "kvtier_hinted_loads_reused_total{tier=\"host\"}"), 5);
  EXPECT_EQ(value_or_nan(t, "kvtier_hinted_loads_total{tier=\"hbm\"}"), 0);
  // NVMe is never where a hint's load goes: no series for it.
  EXPECT_TRUE(std::isnan(value_or_nan(t, "kvtier_hinted_loads_total{tier=\"nvme\"}")));
  EXPECT_EQ(
      value_or_nan(t, "kvtier_link_queued_bytes{src=\"nvme\",dst=\"host\",priority=\"admitted\"}"),
      6 << 20);
  EXPECT_EQ(
      value_or_nan(t, "kvtier_link_queued_bytes{src=\"nvme\",dst=\"host\",priority=\"prefetch\"}"),
      40 << 20);
  EXPECT_EQ(
      value_or_nan(t, "kvtier_link_queued_bytes{src=\"nvme\",dst=\"host\",priority=\"demand\"}"),
      0);
  EXPECT_EQ(value_or_nan(t, "kvtier_link_inflight_bytes{src=\"nvme\",dst=\"host\"}"), 2 << 20);
  EXPECT_EQ(value_or_nan(t, "kvtier_checksum_failures_total"), 2);
  EXPECT_DOUBLE_EQ(value_or_nan(t, "kvtier_stall_seconds_total"), 5e-6);
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_bytes_total{src=\"host\",dst=\"hbm\"}"), 5 * 4096);
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_ops_total{src=\"host\",dst=\"hbm\",result=\"ok\"}"),
            5);
  EXPECT_EQ(
      value_or_nan(t, "kvtier_transfer_ops_total{src=\"host\",dst=\"nvme\",result=\"error\"}"), 3);
  EXPECT_EQ(
      value_or_nan(t, "kvtier_transfer_ops_total{src=\"host\",dst=\"nvme\",result=\"cancelled\"}"),
      1);
  // 3 us samples: above the 2 us bound, within 4 us.
  EXPECT_EQ(value_or_nan(t,
                         "kvtier_transfer_latency_seconds_bucket{src=\"host\",dst=\"hbm\",le="
                         "\"2e-06\"}"),
            0);
  EXPECT_EQ(value_or_nan(t,
                         "kvtier_transfer_latency_seconds_bucket{src=\"host\",dst=\"hbm\",le="
                         "\"4e-06\"}"),
            5);
  EXPECT_EQ(value_or_nan(t,
                         "kvtier_transfer_latency_seconds_bucket{src=\"host\",dst=\"hbm\",le="
                         "\"+Inf\"}"),
            5);
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_latency_seconds_count{src=\"host\",dst=\"hbm\"}"), 5);
  EXPECT_DOUBLE_EQ(value_or_nan(t, "kvtier_transfer_latency_seconds_sum{src=\"host\",dst=\"hbm\"}"),
                   15e-6);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_used_bytes{tier=\"hbm\"}"), 5 * 4096);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_capacity_bytes{tier=\"host\"}"),
            FakeRuntime::kHostCapacity);
  // No probe for NVMe: no NVMe occupancy series (absent, not zero).
  EXPECT_FALSE(sample_value(t, "kvtier_tier_used_bytes{tier=\"nvme\"}").has_value());
  EXPECT_THAT(t, HasSubstr("kvtier_build_info{cuda=\""));
}

TEST(MetricsExporter, StartTimeIsWhenTheExporterWasMade) {
  const auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const double before = unix_now();
  auto e = make_exporter(local_config(""), MetricsSources{});
  const double after = unix_now();
  ASSERT_TRUE(e);
  const double first = value_or_nan(e->scrape_text(), "kvtier_start_time_seconds");
  // The exposition text keeps about 16 significant digits: microseconds at today's Unix time, so
  // the value read back may round past `after` (or below `before`) by that much.
  constexpr double kTextResolution = 1e-5;
  EXPECT_GE(first, before - kTextResolution);
  EXPECT_LE(first, after + kTextResolution);
  EXPECT_EQ(value_or_nan(e->scrape_text(), "kvtier_start_time_seconds"), first)
      << "the start time is fixed, not the scrape's time";
}

TEST(MetricsExporter, MissingSourcesLeaveTheirFamiliesOut) {
  auto e = make_exporter(local_config(""), MetricsSources{});
  ASSERT_TRUE(e);
  EXPECT_THAT(testing::family_names(e->scrape_text()),
              ::testing::ElementsAre("kvtier_build_info", "kvtier_start_time_seconds"));
}

TEST(MetricsExporter, HttpScrapesShowExactCountsWhileCountersMove) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(), rt.sources());
  ASSERT_TRUE(e);
  ASSERT_TRUE(e->serving());
  ASSERT_NE(e->port(), 0);
  EXPECT_EQ(e->url(), "http://127.0.0.1:" + std::to_string(e->port()) + "/metrics");

  // The driver counts steps until the test has scraped a few times mid-run, so the scrapes really
  // race the increments; then the final scrape must show exactly what the driver did.
  std::atomic<int> scrapes{0};
  std::atomic<uint64_t> steps{0};
  std::thread driver([&] {
    while (scrapes.load() < 5 || steps.load() < 1000) {
      rt.step();
      steps.fetch_add(1);
      if (steps.load() % 256 == 0) std::this_thread::yield();
    }
  });
  double last_lookups = 0;
  double last_hits = 0;
  while (scrapes.load() < 5) {
    const testing::HttpResponse r = http_get(e->port(), "/metrics");
    ASSERT_EQ(r.status, 200) << r.error << r.headers;
    const double lookups = value_or_nan(r.body, "kvtier_lookup_tokens_total");
    const double hits = value_or_nan(r.body, "kvtier_hit_tokens_total{tier=\"hbm\"}");
    ASSERT_FALSE(std::isnan(lookups)) << r.body;
    EXPECT_GE(lookups, last_lookups);  // counters never go back
    EXPECT_GE(hits, last_hits);
    last_lookups = lookups;
    last_hits = hits;
    scrapes.fetch_add(1);
  }
  driver.join();
  rt.scheduler.open_sequences.store(3);
  rt.scheduler.pinned_prefix_blocks.store(7);
  const double n = static_cast<double>(steps.load());
  const testing::HttpResponse r = http_get(e->port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_THAT(r.headers, HasSubstr("text/plain"));
  EXPECT_EQ(value_or_nan(r.body, "kvtier_lookup_blocks_total"), 4 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_lookup_tokens_total"), 64 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_hit_blocks_total{tier=\"hbm\"}"), 2 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_hit_tokens_total{tier=\"hbm\"}"), 32 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_hit_tokens_total{tier=\"host\"}"), 16 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_steps_total"), n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_transfer_bytes_total{src=\"host\",dst=\"hbm\"}"),
            4096 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_transfer_latency_seconds_count{src=\"host\",dst=\"hbm\"}"),
            n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_tier_used_bytes{tier=\"hbm\"}"), 4096 * n);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_open_sequences"), 3);
  EXPECT_EQ(value_or_nan(r.body, "kvtier_pinned_prefix_blocks"), 7);
  // The same numbers as the in-process text (the HTTP body adds only the server's own families).
  EXPECT_THAT(r.body, HasSubstr(e->scrape_text()));
}

TEST(MetricsExporter, PromtoolCheckMetricsReportsNoProblems) {
  const std::string promtool = testing::find_executable("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not found (Debian package prometheus)";
  FakeRuntime rt;
  for (int i = 0; i < 3; ++i) rt.step();
  auto e =
      make_exporter(MetricsConfig{"127.0.0.1:0", MetricsConfig{}.latency_buckets}, rt.sources());
  ASSERT_TRUE(e && e->serving());
  const testing::HttpResponse r = http_get(e->port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  testing::TempDir dir;
  const std::string scrape = dir.write("scrape.txt", r.body);
  const std::string log = (dir.path() / "promtool.log").string();
  testing::ChildProcess check({promtool, "check", "metrics"}, log, scrape);
  ASSERT_TRUE(check.started());
  const int rc = check.wait_exit(std::chrono::seconds(60));
  const std::string report = testing::read_text(log);
  EXPECT_EQ(rc, 0) << report;
  EXPECT_THAT(report, IsEmpty());
}

TEST(MetricsExporter, PortInUseIsOneLoggedErrorAndCollectionGoesOn) {
  testing::ListeningSocket busy;
  ASSERT_NE(busy.port(), 0);
  const std::string listen = "127.0.0.1:" + std::to_string(busy.port());
  FakeRuntime rt;
  LogCapture logs;
  auto e = make_exporter(local_config(listen), rt.sources());
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->serving());
  EXPECT_EQ(e->port(), 0);
  EXPECT_EQ(e->url(), "");
  const std::vector<std::string> errors = logs.at(LogLevel::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr(listen));
  EXPECT_THAT(errors[0], HasSubstr("errno " + std::to_string(EADDRINUSE)));
  rt.step();
  EXPECT_EQ(value_or_nan(e->scrape_text(), "kvtier_lookup_tokens_total"), 64);
}

TEST(MetricsExporter, BadAddressesAreLoggedNotFatal) {
  FakeRuntime rt;
  for (const char* listen : {"999.1.1.1:80", "not an address", "127.0.0.1:70000",
                             "192.0.2.1:0" /* TEST-NET-1: not on this machine */}) {
    LogCapture logs;
    auto e = make_exporter(local_config(listen), rt.sources());
    ASSERT_TRUE(e) << listen;
    EXPECT_FALSE(e->serving()) << listen;
    const std::vector<std::string> errors = logs.at(LogLevel::kError);
    ASSERT_EQ(errors.size(), 1u) << listen;
    EXPECT_THAT(errors[0], HasSubstr(listen));
    EXPECT_THAT(e->scrape_text(), HasSubstr("kvtier_lookup_tokens_total"));
  }
}

TEST(MetricsExporter, EmptyListenMeansOffAndSilent) {
  FakeRuntime rt;
  LogCapture logs;
  auto e = make_exporter(local_config(""), rt.sources());
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->serving());
  EXPECT_THAT(logs.at(LogLevel::kError), IsEmpty());
  EXPECT_THAT(logs.at(LogLevel::kWarn), IsEmpty());
}

TEST(MetricsExporter, InvalidBucketsAreRejectedWithTheKey) {
  FakeRuntime rt;
  MetricsConfig c = local_config("");
  c.latency_buckets = {0.5, 0.25};
  auto e = MetricsExporter::create(c, rt.sources());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("metrics.latency_buckets"));
}

TEST(MetricsExporter, DestroyedWhileBeingScraped) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(), rt.sources());
  ASSERT_TRUE(e && e->serving());
  const uint16_t port = e->port();
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::thread scraper([&] {
    while (!stop.load()) {
      if (http_get(port, "/metrics").status == 200) ok.fetch_add(1);
    }
  });
  std::thread driver([&] {
    while (!stop.load()) rt.step();
  });
  while (ok.load() < 20) std::this_thread::yield();
  e.reset();  // must wait for a scrape in flight, then refuse further ones
  const testing::HttpResponse after = http_get(port, "/metrics");
  stop.store(true);
  scraper.join();
  driver.join();
  EXPECT_EQ(after.status, 0);
}

// Two exporters on the same port of different loopback addresses: destroying one shuts down its own
// listening socket (found by full address), never the other's, which goes on serving.
TEST(MetricsExporter, DestroyingOneLeavesAnotherOnTheSamePortServing) {
  FakeRuntime rt;
  auto a = make_exporter(local_config("127.0.0.1:0"), rt.sources());
  ASSERT_TRUE(a && a->serving());
  const uint16_t port = a->port();
  auto b = make_exporter(local_config("127.0.0.2:" + std::to_string(port)), rt.sources());
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->serving()) << "Linux routes all of 127.0.0.0/8 to loopback: 127.0.0.2 binds";
  ASSERT_EQ(b->port(), port);
  b.reset();
  const testing::HttpResponse r = http_get(port, "/metrics");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_THAT(r.body, HasSubstr("kvtier_lookup_tokens_total"));
}

// A functional bound for a scrape while other clients misbehave: well below Prometheus' scrape
// timeout (at most its scrape interval, 5 s in configs/prometheus.yml, 10 s by default) and below
// the 10 s that such clients used to hold a worker. Not a performance measurement: a scrape of the
// fake runtime takes milliseconds.
constexpr std::chrono::seconds kScrapeBound{5};

// Health checkers and port scanners connect and send nothing. Three of them (one more than the
// server used to have workers) must not hold a scrape up until they time out.
TEST(MetricsExporter, IdleConnectionsDoNotDelayAScrape) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(), rt.sources());
  ASSERT_TRUE(e && e->serving());
  std::vector<std::unique_ptr<testing::RawConnection>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<testing::RawConnection>(e->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  // Let the server hand them to workers before the scrape arrives, as it would in production.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  const testing::HttpResponse r = http_get(e->port(), "/metrics");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_LT(took, kScrapeBound) << "a scrape behind 3 idle connections took "
                                << std::chrono::duration<double>(took).count() << " s";
  idle.clear();
}

// A client that sends nothing, half a request, or a request a byte at a time loses its worker
// after the request timeout, counted from the connection's start, well before a scrape timeout.
TEST(MetricsExporter, ClientsThatDoNotFinishARequestAreDropped) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(), rt.sources());
  ASSERT_TRUE(e && e->serving());
  const auto start = std::chrono::steady_clock::now();
  testing::RawConnection silent(e->port());
  testing::RawConnection partial(e->port());
  testing::RawConnection trickle(e->port());
  ASSERT_TRUE(silent.connected() && partial.connected() && trickle.connected());
  ASSERT_TRUE(partial.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ";
  bool trickle_closed = false;
  for (std::size_t i = 0;
       !trickle_closed && std::chrono::steady_clock::now() - start < kScrapeBound; ++i) {
    trickle.send(std::string_view(&request[i % request.size()], 1));
    trickle_closed =
        trickle.closed_by(std::chrono::steady_clock::now() + std::chrono::milliseconds(250));
  }
  const auto deadline = start + kScrapeBound;
  EXPECT_TRUE(trickle_closed) << "a request sent a byte at a time still holds a worker";
  EXPECT_TRUE(silent.closed_by(deadline)) << "a connection that sends nothing still holds a worker";
  EXPECT_TRUE(partial.closed_by(deadline)) << "half a request still holds a worker";
  EXPECT_EQ(http_get(e->port(), "/metrics").status, 200);
}

// /metrics exactly; HEAD answers like GET without the body.
TEST(MetricsExporter, ServesGetAndHeadOfExactlyMetrics) {
  FakeRuntime rt;
  auto e = make_exporter(local_config(), rt.sources());
  ASSERT_TRUE(e && e->serving());
  const testing::HttpResponse get = http_get(e->port(), "/metrics?debug=1");
  EXPECT_EQ(get.status, 200) << get.error;
  EXPECT_THAT(get.body, HasSubstr("kvtier_lookup_tokens_total"));
  const testing::HttpResponse head = testing::http_request(e->port(), "HEAD", "/metrics");
  EXPECT_EQ(head.status, 200) << head.error << head.headers;
  EXPECT_THAT(head.headers, HasSubstr("text/plain"));
  EXPECT_THAT(head.body, IsEmpty());
  for (const char* target : {"/metricsfoo", "/metrics/", "/metrics/x", "/", "/metric"}) {
    const testing::HttpResponse r = http_get(e->port(), target);
    EXPECT_EQ(r.status, 404) << target << ": " << r.error << r.headers;
    EXPECT_EQ(r.body.find("kvtier_"), std::string::npos) << target << " served metrics";
  }
  const testing::HttpResponse post = testing::http_request(e->port(), "POST", "/metrics");
  EXPECT_EQ(post.status, 405) << post.error << post.headers;
  EXPECT_THAT(post.headers, HasSubstr("Allow: GET, HEAD"));
}

// Occupancy and transfer counters of a real (emulated-HBM) tier stack, through the probes the
// runtime will use.
TEST(MetricsExporter, TierStackOccupancyAndTransfersShowUp) {
  testing::TempDir dir;
  Geometry g;
  g.layers = 2;
  g.kv_heads = 1;
  g.head_dim = 64;
  g.page_tokens = 16;  // 4 KiB pages at bf16
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = 8 * FrameArena::frame_stride(g);
  c.host.capacity_bytes = 16 * FrameArena::frame_stride(g);
  c.host.huge_pages = false;
  c.nvme.paths = {(dir.path() / "m.kvs").string()};
  c.nvme.capacity_bytes = 4 * (g.block_bytes() + 4 * 4096);
  c.nvme.queue_depth = 4;
  auto opened = open_tiers(c, g);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  auto e = make_exporter(local_config(""), runtime_metrics_sources(nullptr, s));
  ASSERT_TRUE(e);

  const double stride = static_cast<double>(FrameArena::frame_stride(g));
  std::string t = e->scrape_text();
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_capacity_bytes{tier=\"hbm\"}"), 8 * stride);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_capacity_bytes{tier=\"host\"}"), 16 * stride);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_used_bytes{tier=\"hbm\"}"), 0);
  const double nvme_capacity = value_or_nan(t, "kvtier_tier_capacity_bytes{tier=\"nvme\"}");
  EXPECT_EQ(nvme_capacity,
            static_cast<double>(s.nvme->capacity_blocks() * s.nvme->layout().extent_bytes));
  EXPECT_GT(nvme_capacity, 0);

  // Three HBM frames in use, two pages copied down to host, one block written to NVMe.
  std::vector<uint32_t> held;
  for (int i = 0; i < 3; ++i) {
    auto f = s.hbm->allocator().allocate();
    ASSERT_TRUE(f.ok());
    held.push_back(*f);
  }
  for (uint32_t f = 0; f < 2; ++f) {
    auto h = s.host->allocator().allocate();
    ASSERT_TRUE(h.ok());
  }
  std::vector<FramePair> down = {{held[0], 0}, {held[1], 1}};
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHbmToHost, down)->wait().ok());
  std::vector<uint32_t> host_frames = {0, 1};
  const BlockKey key{0x1234, (uint64_t{0x5A5A} << 48) | 1};  // a shared (namespaced) key
  ASSERT_TRUE(s.engine->write_block(key, host_frames)->wait().ok());

  t = e->scrape_text();
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_used_bytes{tier=\"hbm\"}"), 3 * stride);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_used_bytes{tier=\"host\"}"), 2 * stride);
  EXPECT_EQ(value_or_nan(t, "kvtier_tier_used_bytes{tier=\"nvme\"}"),
            static_cast<double>(s.nvme->layout().extent_bytes));
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_bytes_total{src=\"hbm\",dst=\"host\"}"),
            2 * static_cast<double>(g.page_bytes()));
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_ops_total{src=\"host\",dst=\"nvme\",result=\"ok\"}"),
            1);
  EXPECT_EQ(value_or_nan(t, "kvtier_transfer_latency_seconds_count{src=\"host\",dst=\"nvme\"}"), 1);
}

}  // namespace
}  // namespace kvtier
