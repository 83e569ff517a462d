// Outputs: the JSON object has the keys serving benchmarks use and one entry per baseline, the CSV
// has one row per baseline with as many fields as its header, and summaries are nearest-rank.
#include "bench/run/report.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "bench/run/subprocess.hpp"
#include "run_test_util.hpp"

namespace kvtier::bench::run {
namespace {

RunReport tiny_report() {
  const PerfModel m = testing::h200_8b();
  const Workload w = testing::tiny_chat(m);
  RunReport r;
  r.clock = "virtual";
  r.workload = w.name;
  r.requests = w.requests.size();
  for (const char* name : {"recompute", "hbm_lru", "hbm_host", "kvtier"}) {
    r.baselines.push_back(
        testing::run_or_fail(w, testing::baseline(m, name), m, testing::tiny_tiers(m)));
  }
  return r;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Report, JsonHasOneEntryPerBaselineWithTheServingKeys) {
  const RunReport r = tiny_report();
  std::ostringstream os;
  print_json(os, r);
  const std::string j = os.str();
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(count(j, "{"), count(j, "}"));
  EXPECT_EQ(count(j, "["), count(j, "]"));
  EXPECT_NE(j.find("\"baselines\": ["), std::string::npos);
  for (const char* name : {"recompute", "hbm_lru", "hbm_host", "kvtier"}) {
    EXPECT_EQ(count(j, std::string("\"name\": \"") + name + "\""), 1u) << name;
  }
  for (const char* key :
       {"\"mean_ttft_ms\"", "\"p50_ttft_ms\"", "\"p90_ttft_ms\"", "\"p99_ttft_ms\"",
        "\"mean_tpot_ms\"", "\"p99_tpot_ms\"", "\"requests_per_s\"", "\"hit_rate\"",
        "\"stall_fraction\"", "\"prefetch_timeliness\"", "\"recompute_instead_of_load_tokens\"",
        "\"prefill_gpu_s\""}) {
    EXPECT_EQ(count(j, key), 4u) << key;
  }
  EXPECT_EQ(count(j, "\"hit_rate\": {\"hbm\": "), 4u);
  EXPECT_NE(j.find("\"kvtier_vs_hbm_lru\""), std::string::npos);
  EXPECT_EQ(j.find("nan"), std::string::npos);
  EXPECT_EQ(j.find("inf"), std::string::npos);
}

TEST(Report, CsvRowsMatchTheHeaderAndTheTableNamesEveryBaseline) {
  const RunReport r = tiny_report();
  std::ostringstream csv;
  print_csv(csv, r);
  std::istringstream lines(csv.str());
  std::string header, row;
  ASSERT_TRUE(std::getline(lines, header));
  const std::size_t fields = count(header, ",") + 1;
  int rows = 0;
  while (std::getline(lines, row)) {
    EXPECT_EQ(count(row, ",") + 1, fields) << row;
    ++rows;
  }
  EXPECT_EQ(rows, 4);
  std::ostringstream table;
  print_table(table, r);
  for (const char* name : {"recompute", "hbm_lru", "hbm_host", "kvtier", "TTFT p50", "from NVMe"}) {
    EXPECT_NE(table.str().find(name), std::string::npos) << name;
  }
}

// Hinted loads: a count and the share a request reused, or "-" (JSON null, an empty CSV field)
// where hints loaded nothing, never a share of nothing.
TEST(Report, HintedReuseIsAShareOfTheHintedLoadsAndBlankWithoutAny) {
  RunReport r = tiny_report();
  BaselineResult& kv = r.baselines.back();
  kv.hinted_loads = {};
  kv.hinted_loads_reused = {};
  kv.hinted_loads[tier_index(Tier::kHost)] = 40;
  kv.hinted_loads_reused[tier_index(Tier::kHost)] = 30;
  EXPECT_DOUBLE_EQ(kv.hinted_reuse(Tier::kHost), 0.75);
  EXPECT_TRUE(std::isnan(kv.hinted_reuse(Tier::kHbm)));
  std::ostringstream table;
  print_table(table, r);
  EXPECT_THAT(table.str(), ::testing::ContainsRegex("hinted NVMe reads \\(blocks\\) +0 +0 +0 +40"));
  EXPECT_THAT(table.str(), ::testing::ContainsRegex("reused by a request +- +- +- +75.0 %"));
  std::ostringstream json;
  print_json(json, r);
  EXPECT_NE(json.str().find("\"hinted_reads_reused\": 0.75"), std::string::npos);
  EXPECT_NE(json.str().find("\"hinted_loads_into_hbm_reused\": null"), std::string::npos);
}

// A directory removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / "kvtier_plot_XXXXXX").string();
    EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

TEST(Plot, PathsThatCannotBeWrittenAreRefusedBeforeAnyRun) {
  using ::testing::HasSubstr;
  ScratchDir dir;
  const std::string d = dir.path().string();
  EXPECT_THAT(check_plot_path(d).message(), HasSubstr("--plot " + d + " is a directory"));
  EXPECT_EQ(check_plot_path(d).code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(check_plot_path(dir / "no/such/dir/x.png").message(),
              HasSubstr("cannot create it: No such file or directory"));
  EXPECT_THAT(check_plot_path(dir / "a\nb.png").message(), HasSubstr("control character"));
  EXPECT_THAT(check_plot_path("").message(), HasSubstr("--plot needs a file name"));
  // Checking leaves nothing behind and an existing file as it was.
  (void)check_plot_path(dir / "new.png");  // ok where gnuplot is installed, else kUnavailable
  EXPECT_FALSE(std::filesystem::exists(dir / "new.png"));
  { std::ofstream(dir / "old.png") << "old"; }
  (void)check_plot_path(dir / "old.png");
  EXPECT_EQ(std::filesystem::file_size(dir / "old.png"), 3u);
}

// The path used to be pasted into the gnuplot script between quotes: a quote in it wrote another
// file, and `' ; system '...' ; #` ran a command.
TEST(Plot, AQuoteInThePathIsAFileNameNeverGnuplotSyntax) {
  if (!program_on_path("gnuplot")) GTEST_SKIP() << "gnuplot is not installed (gnuplot-nox)";
  ScratchDir dir;
  const RunReport r = tiny_report();
  const std::string quoted = dir / "it's.png";
  ASSERT_TRUE(write_plot(quoted, r).ok()) << write_plot(quoted, r).to_string();
  EXPECT_GT(std::filesystem::file_size(quoted), 0u);
  const std::string marker = dir / "INJECTED";
  const std::string attack = dir / ("x.png' ; system 'touch " + marker + "' ; #");
  // The attack's "/" makes it a path in a directory that does not exist: an error, no command.
  EXPECT_FALSE(write_plot(attack, r).ok());
  EXPECT_FALSE(std::filesystem::exists(marker));
  // The same without a slash, relative to a directory that exists.
  const std::string flat = dir / "x.png' ; system 'touch INJECTED' ; #";
  ASSERT_TRUE(write_plot(flat, r).ok()) << write_plot(flat, r).to_string();
  EXPECT_TRUE(std::filesystem::exists(flat));
  EXPECT_FALSE(std::filesystem::exists(marker));
  EXPECT_FALSE(std::filesystem::exists("INJECTED"));
}

TEST(Report, PercentilesAreNearestRank) {
  const LatencySummary s = summarize({5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.p50, 5);
  EXPECT_DOUBLE_EQ(s.p90, 9);
  EXPECT_DOUBLE_EQ(s.p99, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_EQ(summarize({}).count, 0u);
}

// Two parts whose medians differ from the mix's: chat answers in 10, 20, 30 ms; docs in 40 ms
// or 1 s. The mix's median (30 ms) is neither part's, and a rejected request counts in none.
RunReport two_part_report() {
  Workload w;
  w.name = "mix";
  w.description = "two parts";
  w.kinds = {"chat", "docs"};
  for (uint32_t kind : {0u, 0u, 0u, 1u, 1u, 1u}) {
    Request q;
    q.kind = kind;
    q.input_tokens = 100;
    q.output_tokens = 2;
    w.requests.push_back(q);
  }
  RunReport r;
  r.clock = "virtual";
  describe_workload(r, w);
  BaselineResult b;
  b.name = "kvtier";
  const std::vector<std::pair<uint32_t, Nanos>> ttft_ms = {{0, 10}, {0, 20},   {0, 30},
                                                           {1, 40}, {1, 1000}, {1, 1000}};
  for (const auto& [kind, ms] : ttft_ms) {
    RequestRecord rec;
    rec.kind = kind;
    rec.arrival = 1'000'000'000;
    rec.first_token = rec.arrival + ms * 1'000'000;
    rec.finish = rec.first_token + 1'000'000;
    rec.input_tokens = 100;
    rec.output_tokens = 2;
    b.records.push_back(rec);
  }
  RequestRecord rejected;
  rejected.kind = 0;
  rejected.rejected = true;
  b.records.push_back(rejected);
  r.baselines.push_back(b);
  return r;
}

TEST(Report, EachPartOfAMixedWorkloadGetsItsOwnTtft) {
  const RunReport r = two_part_report();
  EXPECT_EQ(r.workload, "mix");
  EXPECT_EQ(r.requests, 6u);
  EXPECT_EQ(r.input_tokens, 600u);
  ASSERT_EQ(r.parts, (std::vector<std::string>{"chat", "docs"}));
  const BaselineResult& b = r.baselines[0];
  EXPECT_DOUBLE_EQ(b.ttft_ms().p50, 30);
  EXPECT_DOUBLE_EQ(b.ttft_ms(0).p50, 20);
  EXPECT_DOUBLE_EQ(b.ttft_ms(0).mean, 20);
  EXPECT_EQ(b.ttft_ms(0).count, 3u);
  EXPECT_DOUBLE_EQ(b.ttft_ms(1).p50, 1000);
  EXPECT_DOUBLE_EQ(b.ttft_ms(1).mean, 680);

  std::ostringstream table;
  print_table(table, r);
  const std::string t = table.str();
  EXPECT_THAT(t, ::testing::ContainsRegex("TTFT mean, chat \\(ms\\) +20\\.0\n"));
  EXPECT_THAT(t, ::testing::ContainsRegex("TTFT p50, chat \\(ms\\) +20\\.0\n"));
  EXPECT_THAT(t, ::testing::ContainsRegex("TTFT mean, docs \\(ms\\) +680\n"));
  EXPECT_THAT(t, ::testing::ContainsRegex("TTFT p50, docs \\(ms\\) +1000\n"));
  // Right below the whole mix's TTFT.
  EXPECT_LT(t.find("TTFT p99 (ms)"), t.find("TTFT mean, chat"));
  EXPECT_LT(t.find("TTFT p50, docs"), t.find("TPOT mean"));

  std::ostringstream json;
  print_json(json, r);
  EXPECT_NE(json.str().find("\"ttft_ms_by_part\": {\"chat\": {\"count\": 3, \"mean\": 20, "
                            "\"p50\": 20, \"p90\": 30, \"p99\": 30}, \"docs\": {\"count\": 3, "
                            "\"mean\": 680, \"p50\": 1000, \"p90\": 1000, \"p99\": 1000}}"),
            std::string::npos)
      << json.str();

  std::ostringstream csv;
  print_csv(csv, r);
  std::istringstream lines(csv.str());
  std::string header, row;
  ASSERT_TRUE(std::getline(lines, header));
  ASSERT_TRUE(std::getline(lines, row));
  EXPECT_THAT(header,
              ::testing::EndsWith(
                  ",mean_ttft_ms_chat,p50_ttft_ms_chat,mean_ttft_ms_docs,p50_ttft_ms_docs"));
  EXPECT_THAT(row, ::testing::EndsWith(",20,20,680,1000"));
  EXPECT_EQ(count(header, ","), count(row, ","));
}

TEST(Report, AWorkloadOfOnePartHasNoPerPartRows) {
  RunReport r = tiny_report();
  r.parts = {"chat"};
  std::ostringstream table, csv, json;
  print_table(table, r);
  print_csv(csv, r);
  print_json(json, r);
  EXPECT_EQ(table.str().find("TTFT p50, chat"), std::string::npos);
  EXPECT_EQ(csv.str().find("_ttft_ms_chat"), std::string::npos);
  EXPECT_EQ(count(json.str(), "\"ttft_ms_by_part\": {\"chat\": {\"count\": "), 4u);
}

}  // namespace
}  // namespace kvtier::bench::run
