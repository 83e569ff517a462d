// `kvtier-bench run`, `io` and `check --store` as a user meets them: the built binary run as a
// child process with bad input, which must end in an error naming what was wrong and exit code 2
// (or 1 when the machine cannot do it), never an abort, a hang or output mixed into the JSON. Fake
// gnuplot and fio programs on $PATH make the helper-program cases hermetic; the real ones run where
// installed. Every run is tiny (a couple of requests, a 1 MiB NVMe pass).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/child_process.hpp"
#include "tests/common/sanitizers.hpp"

namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
namespace fs = std::filesystem;

// $KVTIER_BENCH overrides the binary under test (e.g. to check an older build).
std::string bench_path() {
  const char* env = std::getenv("KVTIER_BENCH");
  return env != nullptr && *env ? env : KVTIER_BENCH_PATH;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::path(::testing::TempDir()) / "kvtier_cli_XXXXXX").string();
    EXPECT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

  // An executable shell script `name` in this directory.
  std::string script(const std::string& name, const std::string& body) const {
    const std::string p = *this / name;
    std::ofstream(p) << "#!/bin/sh\n" << body;
    fs::permissions(p, fs::perms::owner_all);
    return p;
  }

 private:
  fs::path path_;
};

using RunOptions = kvtier::testing::ChildOptions;
using kvtier::testing::ChildRun;

ChildRun run_bench(const std::vector<std::string>& args, const RunOptions& o = {}) {
  return kvtier::testing::run_child(bench_path(), args, o);
}

bool on_path(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

std::string path_with(const std::string& dir) {
  const char* path = std::getenv("PATH");
  return dir + ":" + (path != nullptr ? path : "/usr/bin:/bin");
}

// A tiny virtual-clock run: two short conversations, two baselines; milliseconds.
std::vector<std::string> tiny_run(std::vector<std::string> more) {
  std::vector<std::string> a = {
      "run",         "--workload",       "chat",         "--params", "users=2,turns=2",
      "--baselines", "recompute,kvtier", "--no-progress"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Looks like one complete JSON object and nothing else (no gnuplot output, no PNG bytes).
void expect_only_json(const std::string& out) {
  EXPECT_THAT(out, StartsWith("{\"clock\": "));
  ASSERT_GE(out.size(), 2u);
  EXPECT_EQ(out.substr(out.size() - 2), "}\n");
  EXPECT_EQ(out.find("PNG"), std::string::npos);
  EXPECT_EQ(out.find('\0'), std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '{'), std::count(out.begin(), out.end(), '}'));
}

// ---- run --plot ---------------------------------------------------------------------------------

TEST(CliPlot, ADirectoryIsAnErrorBeforeTheRun) {
  ScratchDir dir;
  const ChildRun r = run_bench(tiny_run({"--plot", dir.str()}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--plot " + dir.str() + " is a directory"));
  EXPECT_THAT(r.out, IsEmpty()) << "the run should not have started";
}

TEST(CliPlot, AMissingDirectoryIsAnErrorBeforeTheRun) {
  ScratchDir dir;
  const std::string target = dir / "missing/run.png";
  const ChildRun r = run_bench(tiny_run({"--json", "--plot", target}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--plot " + target + ": cannot create it"));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(CliPlot, MissingGnuplotIsAnErrorBeforeTheRun) {
  ScratchDir dir;
  RunOptions o;
  o.env["PATH"] = dir / "empty";
  const ChildRun r = run_bench(tiny_run({"--plot", dir / "run.png"}), o);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--plot needs gnuplot, which is not installed"));
  EXPECT_THAT(r.out, IsEmpty());
}

// gnuplot draws to its stdout when it cannot open the output; that stdout used to be ours.
TEST(CliPlot, GnuplotsOutputNeverReachesStdoutAndItsErrorIsQuoted) {
  ScratchDir dir;
  dir.script("gnuplot",
             "cat >/dev/null\n"
             "printf '\\211PNG binary garbage'\n"
             "echo 'fake gnuplot: cannot open file; output not changed' >&2\n"
             "exit 1\n");
  RunOptions o;
  o.env["PATH"] = path_with(dir.str());
  const ChildRun r = run_bench(tiny_run({"--json", "--plot", dir / "run.png"}), o);
  EXPECT_EQ(r.exit_code, 1);
  expect_only_json(r.out);
  EXPECT_THAT(r.err, HasSubstr("gnuplot failed drawing " + dir / "run.png"));
  EXPECT_THAT(r.err, HasSubstr("fake gnuplot: cannot open file"));
}

TEST(CliPlot, RealGnuplotKeepsStdoutJsonAndTakesAnyFileName) {
  if (!on_path("gnuplot")) GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
  ScratchDir dir;
  const ChildRun json = run_bench(tiny_run({"--json", "--plot", dir / "run.png"}));
  EXPECT_EQ(json.exit_code, 0) << json.err;
  expect_only_json(json.out);
  EXPECT_THAT(read_text(dir / "run.png"), StartsWith("\x89PNG"));

  const ChildRun quote = run_bench(tiny_run({"--plot", dir / "it's a plot.png"}));
  EXPECT_EQ(quote.exit_code, 0) << quote.err;
  EXPECT_THAT(read_text(dir / "it's a plot.png"), StartsWith("\x89PNG"));
  EXPECT_FALSE(fs::exists(dir / "it")) << "the quote ended gnuplot's string";

  // Was a command in gnuplot's script; relative to the working directory so it has no "/".
  RunOptions in_dir;
  in_dir.cwd = dir.str();
  const std::string attack = "x.png' ; system 'touch INJECTED' ; #";
  const ChildRun injected = run_bench(tiny_run({"--plot", attack}), in_dir);
  EXPECT_EQ(injected.exit_code, 0) << injected.err;
  EXPECT_FALSE(fs::exists(dir / "INJECTED")) << "the file name was run as a gnuplot command";
  EXPECT_THAT(read_text(dir / attack), StartsWith("\x89PNG"));
  EXPECT_FALSE(fs::exists(dir / "x.png"));
}

// ---- run: workload parameters and options -------------------------------------------------------

TEST(CliRun, AHugeWorkloadParameterIsAnErrorNotAnAbort) {
  RunOptions o;
  // Without the bound it grew until std::bad_alloc. (No limit under a sanitizer, whose shadow
  // memory would not fit in it.)
  o.address_space = kvtier::testing::kSanitized ? 0 : uint64_t{4} << 30;
  const ChildRun r = run_bench({"run", "--workload", "chat", "--params", "users=1e99"}, o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("workload chat: users=1e99 is out of range: it must be from 1 to "
                               "100000"));
  const ChildRun zero = run_bench({"run", "--workload", "chat", "--params", "users=0"});
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.err, HasSubstr("users=0 is out of range: it must be from 1"));
}

TEST(CliRun, RunningOutOfMemoryIsAMessageAndExitCode1) {
  if (kvtier::testing::kSanitized) {
    GTEST_SKIP() << "needs a build without a sanitizer, which makes the allocation failure fatal";
  }
  // Within every parameter bound, but more than a 600 MB address space holds.
  RunOptions o;
  o.address_space = uint64_t{600} << 20;
  const ChildRun r = run_bench({"run", "--workload", "docs", "--params",
                                "documents=100000,doc_tokens=1000000", "--no-progress"},
                               o);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kvtier-bench: out of memory (std::bad_alloc)"));
}

TEST(CliRun, PageTokensAndLayerGroupBeyond32BitsAreErrorsNamingTheFlag) {
  const ChildRun pages = run_bench(tiny_run({"--page-tokens", "4294967312"}));
  EXPECT_EQ(pages.exit_code, 2);
  EXPECT_THAT(pages.err, HasSubstr("--page-tokens 4294967312 is too large"));
  EXPECT_THAT(pages.out, IsEmpty()) << "it used to run with 16-token pages";

  const ChildRun group = run_bench(tiny_run({"--layer-group", "4294967296"}));
  EXPECT_EQ(group.exit_code, 2);
  EXPECT_THAT(group.err, HasSubstr("--layer-group 4294967296 is too large"));
  EXPECT_THAT(group.err, Not(HasSubstr("configs/bench"))) << "the preset is not at fault";

  const ChildRun odd = run_bench(tiny_run({"--layer-group", "5"}));
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_THAT(odd.err, HasSubstr("--layer-group 5 must divide the 32 layers of llama-3.1-8b"));
}

TEST(CliRun, ALinkFactorAtOrBelowZeroIsAnError) {
  for (const char* factor : {"0", "-1"}) {
    const ChildRun r = run_bench({"run", "--clock", "real", "--link-factor", factor,
                                  "--real-requests", "1", "--no-progress"});
    EXPECT_EQ(r.exit_code, 2) << factor;
    EXPECT_THAT(r.err, HasSubstr(std::string("--link-factor must be > 0")));
    EXPECT_THAT(r.out, IsEmpty());
  }
}

// --audit checks the scheduler's invariants after every event and changes nothing it reports
// but the wall time; it has no simulated loop to check with the real clock.
TEST(CliRun, AuditingEveryEventPassesAndLeavesTheFiguresAsTheyAre) {
  const ChildRun plain = run_bench(tiny_run({"--csv"}));
  const ChildRun audited = run_bench(tiny_run({"--csv", "--audit", "1"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(audited.exit_code, 0) << audited.err;
  const auto without_wall = [](const std::string& csv) {
    std::string out;
    std::istringstream lines(csv);
    for (std::string line; std::getline(lines, line);) {
      out += line.substr(0, line.rfind(',')) + "\n";  // the last column: wall time
    }
    return out;
  };
  EXPECT_EQ(without_wall(audited.out), without_wall(plain.out));

  const ChildRun real = run_bench(
      {"run", "--clock", "real", "--audit", "1", "--real-requests", "1", "--no-progress"});
  EXPECT_EQ(real.exit_code, 2);
  EXPECT_THAT(real.err, HasSubstr("--audit checks the simulated loop: it needs --clock virtual"));
}

// An emulated HBM larger than the machine can map runs with what it could map (a warning says
// so); the report states that capacity, not the one asked for.
TEST(CliRun, RealClockReportsTheEmulatedHbmItGotNotTheOneAskedFor) {
  const ChildRun r = run_bench(
      {"run", "--clock", "real", "--real-requests", "1", "--no-progress", "--hbm", "1TiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("this machine: emulated HBM "));
  if (r.err.find("could not allocate") != std::string::npos) {
    EXPECT_THAT(r.out, Not(HasSubstr("emulated HBM 1 TiB")));
  } else {  // a machine that maps it (overcommit without limit)
    EXPECT_THAT(r.out, HasSubstr("emulated HBM 1 TiB"));
  }
}

// ---- io -----------------------------------------------------------------------------------------

// The smallest io run: 2 layers, queue depth 2 (a 512 KiB minimum pass), 1 MiB passes.
std::vector<std::string> tiny_io(std::vector<std::string> more) {
  std::vector<std::string> a = {
      "io",     "--set", "model.layers=2", "--set", "tiers.nvme.queue_depth=2",
      "--size", "1MiB",  "--copy-size",    "1MiB",  "--runs",
      "1",      "--json"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  return out;
}

// `check --store` says what each NVMe path holds and what opening the store does with it, and
// creates or writes nothing.
TEST(CliCheck, StoreSaysWhatEachPathHoldsAndWritesNothing) {
  ScratchDir dir;
  std::ofstream(dir / "b.kvs") << "hello";
  const std::string paths =
      "tiers.nvme.paths=[\"" + (dir / "a.kvs") + "\", \"" + (dir / "b.kvs") + "\"]";
  const ChildRun check = run_bench({"check", "--store", "--set", paths});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.out, HasSubstr("a.kvs: missing; created when the store is made"));
  EXPECT_THAT(check.out, HasSubstr("b.kvs: holds something else (5 bytes, too few for a "
                                   "superblock); the store does not open"));
  EXPECT_FALSE(fs::exists(dir / "a.kvs"));
  EXPECT_EQ(read_text(dir / "b.kvs"), "hello");
}

TEST(CliIo, OutOfRangeOptionsAreErrorsBeforeAnyIo) {
  ScratchDir dir;
  const ChildRun size = run_bench({"io", "--size", "1MiB", "--dir", dir.str()});
  EXPECT_EQ(size.exit_code, 2);
  EXPECT_THAT(size.err, HasSubstr("--size 1 MiB is below the minimum of 256 MiB per pass"));

  const ChildRun runs = run_bench(tiny_io({"--runs", "18446744073709551615", "--dir", dir.str()}));
  EXPECT_EQ(runs.exit_code, 2);
  EXPECT_THAT(runs.err, HasSubstr("--runs 18446744073709551615: must be from 1 to 1000"));
  EXPECT_EQ(run_bench(tiny_io({"--runs", "0", "--dir", dir.str()})).exit_code, 2);

  // The copy pass holds --copy-size 4 times; 1 GiB does not fit a 2 GiB address space (which a
  // sanitizer's shadow memory does not fit either).
  if (!kvtier::testing::kSanitized) {
    RunOptions small;
    small.address_space = uint64_t{2} << 30;
    const ChildRun copy = run_bench(tiny_io({"--copy-size", "1GiB", "--dir", dir.str()}), small);
    EXPECT_EQ(copy.exit_code, 2);
    EXPECT_THAT(copy.err, HasSubstr("--copy-size 1 GiB does not fit"));
    EXPECT_THAT(copy.err, Not(HasSubstr("io: run"))) << "the NVMe passes ran first";
  }
  const ChildRun huge = run_bench(tiny_io({"--copy-size", "1PiB", "--dir", dir.str()}));
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_THAT(huge.err, HasSubstr("--copy-size 1 PiB does not fit"));
  EXPECT_THAT(files_in(dir.str()), IsEmpty());
}

// fio used to run through `sh -c` with the file name between single quotes.
TEST(CliIo, FioGetsTheFileNameAsOneArgumentAndTheFilesAreRemoved) {
  ScratchDir bin;
  bin.script("fio",
             "printf '%s\\n' \"$@\" > \"$FAKE_FIO_LOG\"\n"
             "for a; do case \"$a\" in --filename=*) f=\"${a#--filename=}\";; esac; done\n"
             "head -c 4096 /dev/zero > \"$f\"\n"
             "echo '{\"jobs\": [{\"read\": {\"bw_bytes\": 2097152}, \"write\": {\"bw_bytes\": "
             "1048576}}]}'\n");
  ScratchDir work;
  const std::string dir = work / "it's a dir";  // created by io, removed after
  RunOptions o;
  o.env["PATH"] = path_with(bin.str());
  o.env["FAKE_FIO_LOG"] = work / "fio.log";
  const ChildRun r = run_bench(tiny_io({"--dir", dir}), o);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"fio_mib_s\": 2.000"));
  EXPECT_THAT(r.out, HasSubstr("\"fio_mib_s\": 1.000"));
  EXPECT_THAT(read_text(work / "fio.log"),
              HasSubstr("\n--filename=" + dir + "/kvtier-bench-io.fio\n"));
  EXPECT_FALSE(fs::exists(dir)) << "the directory io created is left behind";
}

// Every early return used to skip the unlink of the store and fio files.
TEST(CliIo, AFailingFioLeavesNoFilesAndIsQuoted) {
  ScratchDir bin;
  bin.script("fio",
             "if [ \"$1\" = --version ]; then echo fio-3.33; exit 0; fi\n"
             "for a; do case \"$a\" in --filename=*) f=\"${a#--filename=}\";; esac; done\n"
             "head -c 4096 /dev/zero > \"$f\"\n"
             "echo 'fake fio: cannot do it' >&2\n"
             "exit 1\n");
  ScratchDir dir;
  RunOptions o;
  o.env["PATH"] = path_with(bin.str());
  const ChildRun r = run_bench(tiny_io({"--dir", dir.str()}), o);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fio warm-up"));
  EXPECT_THAT(r.err, HasSubstr("fake fio: cannot do it"));
  EXPECT_THAT(files_in(dir.str()), IsEmpty());
}

TEST(CliIo, RealFioTakesQuotesAndColonsInTheDirectory) {
  if (!on_path("fio")) GTEST_SKIP() << "fio is not installed";
  ScratchDir work;
  struct statfs sf {};
  if (::statfs(work.str().c_str(), &sf) == 0 && sf.f_type == 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << work.str() << " is tmpfs, which refuses fio's O_DIRECT";
  }
  const std::string dir = work / "q'uote:colon $HOME";
  const ChildRun r = run_bench(tiny_io({"--dir", dir}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("\"fio_mib_s\": null")));
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
