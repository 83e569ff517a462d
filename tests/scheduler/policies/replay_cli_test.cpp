// `kvtier-bench replay` as a user runs it: the JSON shape scripts rely on, the --by-distance
// table, usage errors for bad options and input, capacities as decimal token counts, traces that
// cannot be replayed, and a trace path printed as valid UTF-8 in the JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/sanitizers.hpp"
#include "tests/scheduler/policies/replay_test_util.hpp"

namespace kvtier::replay {
namespace {

#ifdef KVTIER_BENCH_PATH
// Runs kvtier-bench with `args`; returns the exit status and the combined output.
std::pair<int, std::string> bench(const std::string& args) {
  const std::string cmd = std::string(KVTIER_BENCH_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ReplayCli, JsonShape) {
  const std::string trace = std::string(KVTIER_TEST_DATA_DIR) + "/replay_tiny.jsonl";
  const auto [status, out] = bench("replay " + trace +
                                   " --capacities 1024,1e6 --lookahead 2 --block-tokens 512 --json"
                                   " --no-progress");
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.rfind("{\"trace\": \"", 0), 0u) << out;
  EXPECT_NE(out.find("\"lookahead\": 2"), std::string::npos);
  EXPECT_NE(out.find("\"results\": ["), std::string::npos);
  std::size_t entries = 0;
  for (std::size_t at = 0; (at = out.find("{\"policy\": ", at)) != std::string::npos; ++at) {
    ++entries;
    const std::string entry = out.substr(at, out.find("}}", at) - at);
    EXPECT_NE(entry.find("\"capacity_tokens\": "), std::string::npos) << entry;
    EXPECT_NE(entry.find("\"hit_rate\": "), std::string::npos) << entry;
    EXPECT_NE(entry.find("\"hit_rate_by_tier\": {\"hbm\": "), std::string::npos) << entry;
    EXPECT_NE(entry.find("\"host\": "), std::string::npos) << entry;
    EXPECT_NE(entry.find("\"nvme\": "), std::string::npos) << entry;
    EXPECT_NE(entry.find("\"hit_rate_by_reuse_distance\": {\"1-32\": "), std::string::npos)
        << entry;
    EXPECT_NE(entry.find("\"2049+\": "), std::string::npos) << entry;
  }
  EXPECT_EQ(entries, 2u * 8u);
  // The tiny trace's reuses are all 1 or 2 requests apart: 1536 of 3824 tokens.
  EXPECT_NE(out.find("\"reusable_hit_rate\": 0.401674, \"reusable_by_reuse_distance\": "
                     "{\"1-32\": 0.401674, \"33-128\": 0, "),
            std::string::npos)
      << out;  // 2 capacities x (5 policies + ref_lru + opt + count_oracle)
  // The hand-computed LRU figure at 2 blocks: 1024 / 3824.
  EXPECT_NE(out.find("{\"policy\": \"ref_lru\", \"capacity_tokens\": 1024, \"hit_rate\": 0.267782"),
            std::string::npos)
      << out;
}

// --by-distance replaces the per-tier columns with the reuse-distance buckets and adds the row of
// a cache that never evicts; without it the table keeps its tier columns.
TEST(ReplayCli, ByDistanceTableShowsHitsByReuseDistance) {
  const std::string trace = std::string(KVTIER_TEST_DATA_DIR) + "/replay_tiny.jsonl";
  const auto [status, out] = bench("replay " + trace +
                                   " --capacities 1024 --block-tokens 512 --policies lru,opt"
                                   " --by-distance --no-progress");
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("1-32    33-128   129-512  513-2048     2049+"), std::string::npos) << out;
  EXPECT_EQ(out.find("nvme"), std::string::npos) << out;
  EXPECT_NE(out.find("(never evicts)               -    40.2 %    40.2 %     0.0 %"),
            std::string::npos)
      << out;
  // LRU at 2 blocks: 1024 of 3824 tokens, all from the request right after.
  EXPECT_NE(out.find("lru                       1024    26.8 %    26.8 %     0.0 %"),
            std::string::npos)
      << out;
  const auto [plain_status, plain] = bench(
      "replay " + trace + " --capacities 1024 --block-tokens 512 --policies lru --no-progress");
  ASSERT_EQ(plain_status, 0) << plain;
  EXPECT_NE(plain.find("nvme"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("2049+"), std::string::npos) << plain;
}

// Options stored as 32 bits are refused above that range instead of wrapping (2^32 + 16 would
// become 16), with a usage error naming the option, before the trace is read.
TEST(ReplayCli, OutOfRangeOptionsAreUsageErrors) {
  const std::string trace = std::string(KVTIER_TEST_DATA_DIR) + "/replay_tiny.jsonl";
  const std::string base = "replay --no-progress --json --capacities 1024 --policies lru " + trace;
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {" --block-tokens 4294967312", "--block-tokens"},
           {" --block-tokens 24", "--block-tokens"},
           {" --block-tokens 1024", "--block-tokens"},
           {" --lookahead 4294967296", "--lookahead"},
           {" --lookahead 18446744073709551615", "--lookahead"},
           {" --threads 4294967297", "--threads"}}) {
    const auto [code, out] = bench(base + args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find("kvtier-bench replay: " + option), std::string::npos) << args << ": " << out;
  }
  const auto [code, out] = bench(base + " --block-tokens 512 --lookahead 4294967295");
  EXPECT_EQ(code, 0) << out;
}

TEST(ReplayCli, AMissingTraceFileIsAnErrorThatNamesIt) {
  const auto [status, out] = bench("replay /nonexistent.jsonl --no-progress");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("cannot open trace /nonexistent.jsonl"), std::string::npos) << out;
}

// The "hit_rate" of each result of a --json output, keyed by policy and capacity_tokens.
std::map<std::pair<std::string, uint64_t>, std::string> json_hit_rates(const std::string& out) {
  std::map<std::pair<std::string, uint64_t>, std::string> rates;
  for (std::size_t at = 0; (at = out.find("{\"policy\": \"", at)) != std::string::npos; ++at) {
    const std::size_t name = at + 12;
    const std::string policy = out.substr(name, out.find('"', name) - name);
    const std::size_t cap = out.find("\"capacity_tokens\": ", at) + 19;
    const std::size_t rate = out.find("\"hit_rate\": ", at) + 12;
    rates[{policy, std::stoull(out.substr(cap))}] =
        out.substr(rate, out.find_first_of(",}", rate) - rate);
  }
  return rates;
}

// A capacity far beyond a small trace replays like one of exactly its blocks (160 blocks of 16
// tokens: 2560 tokens), quickly and in little memory (checked under a 2 GiB address-space limit
// where no sanitizer needs more): 6e10 tokens took 15 GB of frames per run, a bad_alloc that
// ended the process from a replay thread, and 1e15 was refused as needing 2^32 frames.
TEST(ReplayCli, AHugeCapacityReplaysLikeTheWholeTrace) {
  const std::string trace = std::string(KVTIER_TEST_DATA_DIR) + "/replay_tiny.jsonl";
  const std::string limit = ::kvtier::testing::kSanitized ? "" : "ulimit -v 2097152 && ";
  const std::string cmd = "sh -c '" + limit + std::string(KVTIER_BENCH_PATH) + " replay " + trace +
                          " --capacities 6e10,1e15,2560 --block-tokens 16 --lookahead 2"
                          " --threads 2 --json --no-progress' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  const auto rates = json_hit_rates(out);
  ASSERT_EQ(rates.size(), 3u * 8u) << out;
  for (const char* policy :
       {"lru", "lfu", "s3fifo", "prefix_aware", "lookahead", "ref_lru", "opt", "count_oracle"}) {
    const auto whole = rates.find({policy, 2560});
    ASSERT_NE(whole, rates.end()) << policy << "\n" << out;
    EXPECT_EQ(whole->second, "0.401674") << policy;  // 1536 / 3824, every repeated prefix
    for (uint64_t cap : {uint64_t{60000000000}, uint64_t{1000000000000000}}) {
      const auto huge = rates.find({policy, cap});
      ASSERT_NE(huge, rates.end()) << policy << " " << cap << "\n" << out;
      EXPECT_EQ(huge->second, whole->second) << policy << " " << cap;
    }
  }
}

// --capacities takes decimal whole numbers of tokens, at least one block; a value that is not a
// multiple of the block is replayed as the whole blocks below it, and that capacity is the one
// reported (the table says how it was rounded; JSON has both). Each refusal is a usage error that
// quotes the entry (0x10 replayed as 16 tokens, 0x1p20 as 1048576, 0.4 as 0, " 1e6" was taken
// but "1e6 " refused, 0 ran an empty cache, 100 replayed as 0 blocks but was reported as 100).
TEST(ReplayCli, CapacitiesAreDecimalWholeNumbersOfTokens) {
  const std::string trace = std::string(KVTIER_TEST_DATA_DIR) + "/replay_tiny.jsonl";
  const std::string base = "replay --no-progress --policies ref_lru --block-tokens 512 " + trace;
  for (const auto& [cap, why] : std::vector<std::pair<std::string, std::string>>{
           {"0x10", "is not a decimal number"},
           {"0x1p20", "is not a decimal number"},
           {" 1e6", "is not a decimal number"},
           {"1e6 ", "is not a decimal number"},
           {"-1e6", "is not a decimal number"},
           {"inf", "is not a decimal number"},
           {"0.4", "is not a whole number of tokens"},
           {"1e30", "is more than 2^64 - 1 tokens"},
           {"0", "is less than one 512-token block"},
           {"100", "is less than one 512-token block"},
           {"511", "is less than one 512-token block"}}) {
    const auto [code, out] = bench(base + " --capacities '1e6," + cap + "'");
    EXPECT_EQ(code, 2) << "[" << cap << "]: " << out;
    EXPECT_NE(out.find("kvtier-bench replay: --capacities: \"" + cap + "\" " + why),
              std::string::npos)
        << "[" << cap << "]: " << out;
  }
  {
    const auto [code, out] = bench(base + " --capacities 512,1000,2.5e3 --json");
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("{\"policy\": \"ref_lru\", \"capacity_tokens\": 512, \"hit_rate\": "
                       "0, \"requested_tokens\": 512,"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("{\"policy\": \"ref_lru\", \"capacity_tokens\": 512, \"hit_rate\": "
                       "0, \"requested_tokens\": 1000,"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("{\"policy\": \"ref_lru\", \"capacity_tokens\": 2048, \"hit_rate\": "
                       "0.401674, \"requested_tokens\": 2500,"),
              std::string::npos)
        << out;
  }
  const auto [code, out] = bench(base + " --capacities 1000");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("capacity  1000 tokens is not a whole number of 512-token blocks: replayed "
                     "as 1 block, 512 tokens\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\nref_lru                    512 "), std::string::npos) << out;
}

// A directory, an empty file and a missing file are errors (the first two replayed "0 requests"
// with every hit rate 0 and exit 0); an unsorted trace is a usage error naming the line.
TEST(ReplayCli, TraceFilesThatCannotBeReplayedAreErrors) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string empty = dir.write("empty.jsonl", "");
  const std::string unsorted = dir.write(
      "unsorted.jsonl",
      "{\"timestamp\": 10, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n");
  for (const auto& [path, code, message] : std::vector<std::tuple<std::string, int, std::string>>{
           {dir.path(), 2, "trace " + dir.path() + " is a directory, not a regular file"},
           {empty, 2, empty + ": no requests"},
           {dir.path() + "/missing.jsonl", 1, "cannot open trace " + dir.path() + "/missing.jsonl"},
           {unsorted, 2, unsorted + ":2:15: \"timestamp\" of 5 ms is earlier than the 10 ms"}}) {
    const auto [got, out] = bench("replay --no-progress --capacities 1e6 " + path);
    EXPECT_EQ(got, code) << path << ": " << out;
    EXPECT_NE(out.find("kvtier-bench replay: " + message), std::string::npos) << out;
    EXPECT_EQ(out.find("requests,"), std::string::npos) << out;  // no table
  }
  const auto [got, out] =
      bench("replay --no-progress --capacities 1e6 --synthetic chat --synthetic-requests 0");
  EXPECT_EQ(got, 2) << out;
  EXPECT_NE(out.find(": no requests"), std::string::npos) << out;
}

// Well-formed UTF-8, after json_string's escapes (a JSON text must be UTF-8).
bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80                 ? 1
                    : c >= 0xC2 && c <= 0xDF ? 2
                    : c >= 0xE0 && c <= 0xEF ? 3
                    : c >= 0xF0 && c <= 0xF4 ? 4
                                             : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// The trace path in --json is the file system's bytes, not necessarily UTF-8: a byte that is not
// part of well-formed UTF-8 becomes U+FFFD (it passed through and made the output invalid JSON);
// well-formed UTF-8 passes through.
TEST(ReplayCli, JsonTracePathIsValidUtf8) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.write("t\xFF\xC3\xA9\xC3.jsonl", kTiny);
  const auto [code, out] =
      bench("replay --no-progress --json --policies lru --capacities 1e6 '" + path + "'");
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(valid_utf8(out)) << out;
  EXPECT_NE(out.find("{\"trace\": \"" + dir.path() + "/t\\ufffd\xC3\xA9\\ufffd.jsonl\""),
            std::string::npos)
      << out;
}
#endif

}  // namespace
}  // namespace kvtier::replay
