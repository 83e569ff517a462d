#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/kvtier_bench/args.hpp"

namespace kvtier::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Result<SplitCommandLine> split(std::vector<std::string> args) { return split_command_line(args); }

TEST(SplitCommandLine, CommonOptionsBeforeAndAfterTheCommand) {
  auto r = split({"--config", "a.yaml", "check", "--set", "x.y=1", "--json", "--set=z=2", "pos"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->common.config_file, "a.yaml");
  EXPECT_THAT(r->common.overrides, ElementsAre("x.y=1", "z=2"));
  EXPECT_EQ(r->command, "check");
  EXPECT_THAT(r->command_args, ElementsAre("--json", "pos"));
  EXPECT_FALSE(r->common.help);
}

TEST(SplitCommandLine, ConfigEqualsFormHelpAndVersion) {
  auto r = split({"check", "--config=b.yaml", "-h"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->common.config_file, "b.yaml");
  EXPECT_TRUE(r->common.help);
  auto v = split({"--version"});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->common.version);
  EXPECT_FALSE(v->command.has_value());
}

TEST(SplitCommandLine, DoubleDashEndsOptions) {
  auto r = split({"check", "--", "--set", "-x"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->common.overrides.empty());
  EXPECT_THAT(r->command_args, ElementsAre("--", "--set", "-x"));
}

TEST(SplitCommandLine, Errors) {
  auto missing = split({"check", "--set"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "option --set needs a value");
  auto unknown = split({"--confg", "a.yaml", "check"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "unknown option --confg; did you mean --config? (a command's own options go after "
            "the command name)");
}

TEST(OptionParser, ParsesDeclaredOptions) {
  bool json = false;
  std::string trace;
  uint64_t seconds = 0;
  double ratio = 0;
  uint64_t bytes = 0;
  std::vector<std::string> files;
  OptionParser p("kvtier-bench x");
  p.add_flag("json", "print JSON", &json);
  p.add_string("trace", "FILE", "trace to replay", &trace);
  p.add_uint("seconds", "N", "how long", &seconds);
  p.add_double("ratio", "R", "a ratio", &ratio);
  p.add_size("bytes", "SIZE", "how much", &bytes);
  p.allow_positionals("FILE", "inputs", &files);
  const std::vector<std::string> args = {"--json",  "--trace", "t.csv",          "--seconds=5",
                                         "--ratio", "0.25",    "--bytes",        "1.5KiB",
                                         "a",       "--",      "--not-an-option"};
  Status s = p.parse(args);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(json);
  EXPECT_EQ(trace, "t.csv");
  EXPECT_EQ(seconds, 5u);
  EXPECT_EQ(ratio, 0.25);
  EXPECT_EQ(bytes, 1536u);
  EXPECT_THAT(files, ElementsAre("a", "--not-an-option"));
  EXPECT_EQ(p.usage_suffix(), " [options] FILE...");
  EXPECT_THAT(p.options_help(), HasSubstr("  --trace FILE            trace to replay\n"));
}

TEST(OptionParser, ErrorsNameTheOption) {
  bool json = false;
  uint64_t seconds = 0;
  uint64_t bytes = 0;
  OptionParser p("kvtier-bench x");
  p.add_flag("json", "print JSON", &json);
  p.add_uint("seconds", "N", "how long", &seconds);
  p.add_size("bytes", "SIZE", "how much", &bytes);
  auto message = [&p](std::vector<std::string> args) {
    Status s = p.parse(args);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.message();
  };
  EXPECT_EQ(message({"--jsn"}), "unknown option --jsn for kvtier-bench x; did you mean --json?");
  EXPECT_EQ(message({"--seconds", "soon"}), "--seconds soon: expected an integer >= 0");
  EXPECT_EQ(message({"--seconds"}), "option --seconds needs a value");
  EXPECT_EQ(message({"--json=1"}), "--json takes no value");
  EXPECT_EQ(message({"stray"}), "unexpected argument \"stray\" for kvtier-bench x");
  EXPECT_THAT(message({"--bytes", "4 GB"}), HasSubstr("--bytes: \"4 GB\" is not a size"));
}

}  // namespace
}  // namespace kvtier::bench
