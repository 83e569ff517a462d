// Runs build/bin/kvtier-bench as a child process and checks exit codes and output: the frame's
// contract with `make run`, scripts and CI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/common/child_process.hpp"
#include "tests/runtime/config_test_util.hpp"

namespace kvtier {
namespace {

using ::kvtier::testing::read_text;
using ::kvtier::testing::source_dir;
using ::kvtier::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

using ::kvtier::testing::ChildRun;

// Runs kvtier-bench with `args` and an environment without KVTIER_* variables plus `env`.
ChildRun run_bench(const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env = {}) {
  ::kvtier::testing::ChildOptions options;
  options.env = env;
  return ::kvtier::testing::run_child(KVTIER_BENCH_PATH, args, options);
}

TEST(Cli, CheckOnTheEmbeddedDefault) {
  const ChildRun r = run_bench({"check"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("kvtier configuration check: embedded default\n"));
  EXPECT_THAT(r.out, HasSubstr("32 layers, 8 kv heads x head_dim 128, bf16, 16 tokens/page"));
  EXPECT_THAT(r.out, HasSubstr("allocator hbm: 16384 frames, 16384 free, audit ok\n"));
  EXPECT_THAT(r.out, HasSubstr("allocator host: 65536 frames, 65536 free, audit ok\n"));
  EXPECT_THAT(r.out, HasSubstr("allocator nvme: 8176 extents in 1 file, 8176 free, audit ok\n"));
  EXPECT_THAT(r.out, HasSubstr("\ncheck ok\n"));
  EXPECT_THAT(r.err, IsEmpty());
}

TEST(Cli, CheckWithAPresetAndOverridesAnywhere) {
  const std::string preset = (source_dir() / "configs/llama-3.1-70b-h200.yaml").string();
  const ChildRun r = run_bench({"--set", "tiers.hbm.capacity=8GiB", "check", "--config", preset,
                                "--set=tiers.nvme.enabled=false"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(preset + " with 2 overrides"));
  EXPECT_THAT(r.out, HasSubstr("80 layers"));
  EXPECT_THAT(r.out, HasSubstr("allocator hbm: 131072 frames"));
  EXPECT_THAT(r.out, HasSubstr("allocator nvme: disabled"));
}

TEST(Cli, ConfigFileFromTheEnvironmentAndKeyVariables) {
  TempDir dir;
  const std::string file = dir.write("c.yaml", "tiers:\n  hbm:\n    capacity: 2GiB\n");
  const ChildRun r = run_bench({"check"}, {{"KVTIER_CONFIG_FILE", file},
                                           {"KVTIER_TIERS__HOST__CAPACITY", "1GiB"},
                                           {"KVTIER_CACHE_DIR", "/tmp/kvtier-cli-test"}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(file + " (KVTIER_CONFIG_FILE)"));
  EXPECT_THAT(r.out, HasSubstr("allocator hbm: 32768 frames"));
  EXPECT_THAT(r.out, HasSubstr("allocator host: 16384 frames"));
  EXPECT_THAT(r.out, HasSubstr("path /tmp/kvtier-cli-test/store0.kvs"));
}

TEST(Cli, BadSetIsAConfigurationErrorWithExitCode2) {
  const ChildRun r = run_bench({"check", "--set", "tiers.host.capacity=abc"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_EQ(r.err,
            "kvtier-bench: configuration error: --set tiers.host.capacity=abc: "
            "tiers.host.capacity: \"abc\" is not a size: it must start with a number, e.g. "
            "512MiB, 64GiB or 1.5TB\n");
}

TEST(Cli, BadFileNamesFileLineAndColumn) {
  TempDir dir;
  const std::string file = dir.write("bad.yaml", "tiers:\n  host:\n    capcity: 4GiB\n");
  const ChildRun r = run_bench({"check", "--config", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(file + ":3:5: tiers.host.capcity: unknown key; did you mean "
                                      "\"capacity\"?"));
  const ChildRun missing = run_bench({"check", "--config", file + ".absent"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr(".absent: cannot open: No such file or directory (errno 2)"));
}

TEST(Cli, UsageErrors) {
  const ChildRun none = run_bench({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("usage: kvtier-bench"));

  const ChildRun unknown_command = run_bench({"chek"});
  EXPECT_EQ(unknown_command.exit_code, 2);
  EXPECT_THAT(unknown_command.err,
              HasSubstr("unknown command \"chek\"; did you mean \"check\"? (commands: check"));

  const ChildRun unknown_option = run_bench({"check", "--frobnicate"});
  EXPECT_EQ(unknown_option.exit_code, 2);
  EXPECT_THAT(unknown_option.err,
              HasSubstr("kvtier-bench: unknown option --frobnicate for kvtier-bench check\n"));
  EXPECT_THAT(unknown_option.err, HasSubstr("try `kvtier-bench check --help`"));

  const ChildRun before = run_bench({"--frobnicate", "check"});
  EXPECT_EQ(before.exit_code, 2);
  EXPECT_THAT(before.err, HasSubstr("unknown option --frobnicate"));

  const ChildRun stray = run_bench({"check", "extra"});
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_THAT(stray.err, HasSubstr("unexpected argument \"extra\""));
}

TEST(Cli, RunMetricsOptionsAreCheckedBeforeAnythingRuns) {
  const ChildRun address = run_bench({"run", "--metrics", "nonsense", "--no-progress"});
  EXPECT_EQ(address.exit_code, 2);
  EXPECT_THAT(address.err, HasSubstr("--metrics: \"nonsense\" is not a listen address"));
  const ChildRun hold = run_bench({"run", "--metrics-hold", "3", "--no-progress"});
  EXPECT_EQ(hold.exit_code, 2);
  EXPECT_THAT(hold.err, HasSubstr("--metrics-hold needs --metrics HOST:PORT"));
  const ChildRun no_kvtier =
      run_bench({"run", "--metrics", "127.0.0.1:0", "--baselines", "recompute", "--no-progress"});
  EXPECT_EQ(no_kvtier.exit_code, 2);
  EXPECT_THAT(no_kvtier.err, HasSubstr("add kvtier to --baselines"));
}

TEST(Cli, HelpNeedsNoValidConfiguration) {
  const ChildRun main_help = run_bench({"--help", "--set", "tiers.host.capacity=abc"});
  EXPECT_EQ(main_help.exit_code, 0);
  EXPECT_THAT(main_help.out, HasSubstr("commands:\n  check"));
  EXPECT_THAT(main_help.out, HasSubstr("--config PATH"));
  EXPECT_THAT(main_help.out, HasSubstr("--set KEY=VALUE"));

  const ChildRun check_help = run_bench({"check", "--help"});
  EXPECT_EQ(check_help.exit_code, 0);
  EXPECT_THAT(check_help.out, StartsWith("usage: kvtier-bench check"));
  EXPECT_THAT(check_help.err, IsEmpty());

  const ChildRun version = run_bench({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.out, StartsWith("kvtier-bench "));
  EXPECT_THAT(version.out, Not(IsEmpty()));
}

}  // namespace
}  // namespace kvtier
