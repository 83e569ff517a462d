// Outputs: the JSON object has the keys serving benchmarks use and one entry per baseline, the CSV
// has one row per baseline with as many fields as its header, and summaries are nearest-rank.
#include "bench/run/report.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

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

}  // namespace
}  // namespace kvtier::bench::run
