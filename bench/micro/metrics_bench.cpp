// What metrics cost the data path: the counter increments of one engine step (scheduler hits and
// lookups, one transfer's bytes, ops and latency sample) with nobody scraping, beside the same
// loop while a second thread scrapes /metrics over HTTP from a live MetricsExporter
//   - every 10 ms (100 times more often than a 1 s Prometheus scrape interval), and
//   - back to back (the worst case: scrape after scrape, as fast as the server answers).
// The three run interleaved in random order, repeated; the figure is the ratio of the median
// increments/s (CPU time of the counting thread) with a scraper to without. Also measured: the
// cost of one scrape, in process (Collect + text) and over HTTP.
// Run: build/bin/metrics_bench [--benchmark_repetitions=N] [--benchmark_filter=...]
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/log.hpp"
#include "runtime/metrics_exporter.hpp"

namespace kvtier {
namespace {

struct Counters {
  SchedulerStats scheduler;
  TransferStats transfer;
  std::atomic<uint64_t> hbm_used{0};
};

struct Served {
  Counters counters;
  std::unique_ptr<MetricsExporter> exporter;
};

// One exporter for the whole run, serving on a free loopback port.
Served& served() {
  static Served* s = [] {
    auto* out = new Served();
    MetricsSources sources;
    sources.scheduler = &out->counters.scheduler;
    sources.transfer = &out->counters.transfer;
    for (const Tier t : kAllTiers) {
      sources.occupancy[tier_index(t)] = [out] {
        return TierOccupancy{out->counters.hbm_used.load(std::memory_order_relaxed), 1ull << 30};
      };
    }
    MetricsConfig config;
    config.listen = "127.0.0.1:0";
    auto e = MetricsExporter::create(config, sources);
    if (!e.ok() || !(*e)->serving()) {
      std::fprintf(stderr, "metrics_bench: no exporter on loopback: %s\n",
                   e.ok() ? "not serving" : e.status().to_string().c_str());
      std::exit(1);
    }
    out->exporter = std::move(e).value();
    return out;
  }();
  return *s;
}

// The counting one engine step does: what the hot path pays for metrics.
inline void count_step(Counters& c, uint64_t i) {
  SchedulerStats& s = c.scheduler;
  s.lookup_blocks.fetch_add(4, std::memory_order_relaxed);
  s.lookup_tokens.fetch_add(64, std::memory_order_relaxed);
  s.hit_blocks[tier_index(Tier::kHbm)].fetch_add(2, std::memory_order_relaxed);
  s.hit_tokens[tier_index(Tier::kHbm)].fetch_add(32, std::memory_order_relaxed);
  s.hit_blocks[tier_index(Tier::kHost)].fetch_add(1, std::memory_order_relaxed);
  s.hit_tokens[tier_index(Tier::kHost)].fetch_add(16, std::memory_order_relaxed);
  s.steps.fetch_add(1, std::memory_order_relaxed);
  LinkStats& link = c.transfer.link(Link::kHostToHbm);
  link.bytes.fetch_add(65536, std::memory_order_relaxed);
  link.ops.fetch_add(1, std::memory_order_relaxed);
  link.latency.record(20'000 + (i & 1023) * 100);
  c.hbm_used.fetch_add(4096, std::memory_order_relaxed);
}

// GET /metrics on 127.0.0.1:port; the body's size, or 0 on failure.
std::size_t scrape_over_http(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::size_t total = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    static constexpr char kRequest[] =
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, kRequest, sizeof kRequest - 1, MSG_NOSIGNAL) ==
        static_cast<ssize_t>(sizeof kRequest - 1)) {
      char buf[16384];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) total += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return total;
}

// A thread scraping /metrics every `period` (zero: back to back) until destroyed.
class Scraper {
 public:
  Scraper(uint16_t port, std::chrono::microseconds period) {
    thread_ = std::thread([this, port, period] {
      auto next = std::chrono::steady_clock::now();
      while (!stop_.load(std::memory_order_relaxed)) {
        if (scrape_over_http(port) > 0) scrapes_.fetch_add(1, std::memory_order_relaxed);
        if (period.count() > 0) {
          next += period;
          std::this_thread::sleep_until(next);
        }
      }
    });
  }
  ~Scraper() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t scrapes() const { return scrapes_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

// period < 0: no scraper; 0: back to back; > 0: paced.
void hot_path(benchmark::State& state, std::chrono::microseconds period) {
  Served& s = served();
  std::unique_ptr<Scraper> scraper;
  if (period.count() >= 0) {
    scraper = std::make_unique<Scraper>(s.exporter->port(), period);
    // Let the first scrape start, so the loop below runs against a live scraper throughout.
    while (scraper->scrapes() == 0) std::this_thread::yield();
  }
  uint64_t i = 0;
  for (auto _ : state) count_step(s.counters, i++);
  const double scrapes = scraper ? static_cast<double>(scraper->scrapes()) : 0.0;
  scraper.reset();
  state.SetItemsProcessed(state.iterations());
  state.counters["scrapes"] = scrapes;
}

void BM_ScrapeInProcess(benchmark::State& state) {
  Served& s = served();
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = s.exporter->scrape_text();
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}

void BM_ScrapeOverHttp(benchmark::State& state) {
  Served& s = served();
  std::size_t bytes = 0;
  for (auto _ : state) {
    bytes = scrape_over_http(s.exporter->port());
    if (bytes == 0) state.SkipWithError("scrape failed");
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}

constexpr const char* kNone = "hot_path/no_scraper";
constexpr const char* kPaced = "hot_path/scrape_every_10ms";
constexpr const char* kBackToBack = "hot_path/scrape_back_to_back";

// Console output as usual, plus the medians of the hot-path runs for the ratio printed at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Aggregate || r.aggregate_name != "median") continue;
      const auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) median_[r.run_name.function_name] = it->second.value;
    }
  }
  void print_ratios() const {
    const auto base = median_.find(kNone);
    if (base == median_.end() || base->second <= 0) return;
    std::printf("\nhot-path increments with a scraper / without (median steps/s, CPU time):\n");
    for (const char* name : {kPaced, kBackToBack}) {
      const auto it = median_.find(name);
      if (it == median_.end()) continue;
      std::printf("  %-30s %.4f  (%+.2f %%)\n", name, it->second / base->second,
                  (it->second / base->second - 1.0) * 100.0);
    }
  }

 private:
  std::map<std::string, double> median_;
};

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  using namespace kvtier;
  set_log_level(LogLevel::kWarn);
  // Defaults that make the comparison fair: repetitions interleaved at random, medians reported.
  std::vector<std::string> args(argv, argv + argc);
  auto has = [&](const std::string& flag) {
    return std::any_of(args.begin(), args.end(),
                       [&](const std::string& a) { return a.rfind(flag, 0) == 0; });
  };
  if (!has("--benchmark_repetitions")) args.push_back("--benchmark_repetitions=10");
  if (!has("--benchmark_enable_random_interleaving")) {
    args.push_back("--benchmark_enable_random_interleaving=true");
  }
  if (!has("--benchmark_report_aggregates_only")) {
    args.push_back("--benchmark_report_aggregates_only=true");
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  int cargc = static_cast<int>(cargs.size());
  benchmark::Initialize(&cargc, cargs.data());

  benchmark::RegisterBenchmark(kNone, [](benchmark::State& s) {
    hot_path(s, std::chrono::microseconds(-1));
  })->MinTime(0.3);
  benchmark::RegisterBenchmark(kPaced, [](benchmark::State& s) {
    hot_path(s, std::chrono::milliseconds(10));
  })->MinTime(0.3);
  benchmark::RegisterBenchmark(kBackToBack, [](benchmark::State& s) {
    hot_path(s, std::chrono::microseconds(0));
  })->MinTime(0.3);
  benchmark::RegisterBenchmark("scrape/in_process", BM_ScrapeInProcess)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("scrape/over_http", BM_ScrapeOverHttp)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();

  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_ratios();
  benchmark::Shutdown();
  return 0;
}
