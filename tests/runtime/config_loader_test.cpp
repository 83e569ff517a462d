#include "runtime/config_loader.hpp"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>

#include "runtime/config_schema.hpp"
#include "tests/runtime/config_test_util.hpp"

namespace kvtier {
namespace {

using ::kvtier::testing::error_of;
using ::kvtier::testing::read_text;
using ::kvtier::testing::source_dir;
using ::kvtier::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

Result<Config> parse(std::string_view yaml) { return parse_config(yaml, "t.yaml"); }

// Sources that read only what the test gives them.
ConfigSources hermetic(std::map<std::string, std::string> env = {}) {
  ConfigSources s;
  s.environment = std::move(env);
  return s;
}

// ---------------------------------------------------------------------------------------------
// The embedded default
// ---------------------------------------------------------------------------------------------

TEST(EmbeddedDefault, IsTheTextOfConfigsDefaultYaml) {
  EXPECT_EQ(embedded_default_config(), read_text(source_dir() / "configs/default.yaml"));
}

TEST(EmbeddedDefault, EqualsADefaultConstructedConfig) {
  auto parsed = parse_config(embedded_default_config(), kEmbeddedConfigName);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(*parsed == Config{});
  auto loaded = load_config(hermetic());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_TRUE(*loaded == Config{});
  EXPECT_EQ(loaded->tiers.nvme.paths, std::vector<std::string>{"./.kvtier/store0.kvs"});
}

TEST(EmbeddedDefault, EmptyTextMeansTheDefault) {
  for (std::string_view text : {"", "# nothing\n", "---\n", "tiers:\n", "model: {}\n"}) {
    auto r = parse(text);
    ASSERT_TRUE(r.ok()) << "\"" << text << "\": " << r.status().to_string();
    EXPECT_TRUE(*r == Config{}) << text;
  }
}

// Walks `path` ("a.b.c") through a YAML document. Recursion, not a loop: assigning to a
// YAML::Node writes into the node it refers to rather than rebinding it.
bool has_path(const YAML::Node& node, std::string_view path) {
  const std::size_t dot = path.find('.');
  const std::string word(path.substr(0, dot));
  if (!node.IsMap() || !node[word]) return false;
  return dot == std::string_view::npos || has_path(node[word], path.substr(dot + 1));
}

TEST(EmbeddedDefault, NamesEveryKey) {
  const YAML::Node doc = YAML::Load(std::string(embedded_default_config()));
  for (const ConfigKey& key : config_keys()) {
    EXPECT_TRUE(has_path(doc, key.path)) << key.path << " is missing from configs/default.yaml";
  }
}

TEST(EmbeddedDefault, ReadmeReferenceNamesEveryKey) {
  const std::string readme = read_text(source_dir() / "README.md");
  const std::size_t start = readme.find("## Configuration reference");
  ASSERT_NE(start, std::string::npos);
  const std::size_t end = readme.find("\n## ", start + 1);
  const std::string section = readme.substr(start, end - start);
  for (const ConfigKey& key : config_keys()) {
    EXPECT_THAT(section, HasSubstr("`" + std::string(key.path) + "`"))
        << "the README's configuration reference does not describe " << key.path;
  }
}

TEST(Presets, EveryShippedConfigurationLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    auto r = parse_config(read_text(entry.path()), entry.path().filename().string());
    EXPECT_TRUE(r.ok()) << entry.path() << ": " << r.status().to_string();
  }
  EXPECT_GE(count, 3);
}

TEST(Presets, SeventyBOnH200HasItsGeometry) {
  auto r = parse_config(read_text(source_dir() / "configs/llama-3.1-70b-h200.yaml"), "70b");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model.geometry.layers, 80u);
  EXPECT_EQ(r->model.geometry.kv_heads, 8u);
  EXPECT_EQ(r->model.geometry.head_dim, 128u);
  EXPECT_EQ(r->model.geometry.dtype, Dtype::kBF16);
  EXPECT_EQ(r->model.geometry.block_bytes(), 80u * 64 * 1024);
  EXPECT_EQ(r->tiers.hbm.backend, HbmBackend::kCuda);
  EXPECT_EQ(r->tiers.nvme.paths.size(), 2u);
  EXPECT_EQ(r->tiers.nvme.capacity_bytes, 7'000'000'000'000ull);
}

// ---------------------------------------------------------------------------------------------
// Every key reaches its field
// ---------------------------------------------------------------------------------------------

TEST(Keys, EveryKeyIsReadIntoItsOwnField) {
  const char* yaml = R"(
model:
  name: m
  namespace: ns
  layers: 7
  kv_heads: 3
  head_dim: 256
  dtype: f32
  page_tokens: 64
tiers:
  hbm:
    backend: emulated
    capacity: 3GiB
    device: 2
    watermarks: {low: 0.5, high: 0.6}
    link_gbps: 25.5
  host:
    capacity: 10GiB
    numa: 1
    huge_pages: false
    lock_memory: false
    kv_dtype: fp8_e4m3
    watermarks: {low: 0.4, high: 0.7}
  nvme:
    enabled: true
    capacity: 100GB
    paths: [/a/x.kvs, /b/y.kvs]
    queue_depth: 32
    io_threads: 4
    direct_io: false
    sqpoll: true
    checksum: crc32c
    kv_dtype: fp8_e4m3
    read_gbps: 6.5
    write_gbps: 3.25
    pause_after_failed_writes: 0
    pause_after_failed_reads: 3
    pause_ms: 2500
    io_timeout_ms: 750
    out_of_service_after_failures: 20
    readmit_after_ms: 4000
    watermarks: {low: 0.3, high: 0.8}
policies:
  eviction: s3fifo
  write: write_through_selective
  write_selective_hits: 5
  admission: {nvme_min_hits: 3}
  prefetch:
    depth: 9
    layerwise: false
    layer_window: 2
    deadline_ms: 50
    on_late: recompute
  prefill_tokens_per_s: 1234.5
metrics:
  listen: "0.0.0.0:1234"
  latency_buckets: [0.5, 2]
)";
  auto r = parse(yaml);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Config& c = *r;
  EXPECT_EQ(c.model.name, "m");
  EXPECT_EQ(c.model.key_namespace, "ns");
  EXPECT_EQ(c.model.geometry.layers, 7u);
  EXPECT_EQ(c.model.geometry.kv_heads, 3u);
  EXPECT_EQ(c.model.geometry.head_dim, 256u);
  EXPECT_EQ(c.model.geometry.dtype, Dtype::kF32);
  EXPECT_EQ(c.model.geometry.page_tokens, 64u);
  EXPECT_EQ(c.tiers.hbm.backend, HbmBackend::kEmulated);
  EXPECT_EQ(c.tiers.hbm.capacity_bytes, 3ull << 30);
  EXPECT_EQ(c.tiers.hbm.device, 2);
  EXPECT_EQ(c.tiers.hbm.watermarks.low, 0.5);
  EXPECT_EQ(c.tiers.hbm.watermarks.high, 0.6);
  EXPECT_EQ(c.tiers.hbm.link_gbps, 25.5);
  EXPECT_EQ(c.tiers.host.capacity_bytes, 10ull << 30);
  EXPECT_EQ(c.tiers.host.numa_node, 1);
  EXPECT_FALSE(c.tiers.host.huge_pages);
  EXPECT_FALSE(c.tiers.host.lock_memory);
  EXPECT_EQ(c.tiers.host.watermarks.low, 0.4);
  EXPECT_EQ(c.tiers.host.watermarks.high, 0.7);
  EXPECT_TRUE(c.tiers.nvme.enabled);
  EXPECT_EQ(c.tiers.nvme.capacity_bytes, 100'000'000'000ull);
  EXPECT_EQ(c.tiers.nvme.paths, (std::vector<std::string>{"/a/x.kvs", "/b/y.kvs"}));
  EXPECT_EQ(c.tiers.nvme.queue_depth, 32u);
  EXPECT_EQ(c.tiers.nvme.io_threads, 4u);
  EXPECT_FALSE(c.tiers.nvme.direct_io);
  EXPECT_TRUE(c.tiers.nvme.sqpoll);
  EXPECT_EQ(c.tiers.nvme.checksum, ChecksumKind::kCrc32c);
  EXPECT_EQ(c.tiers.nvme.kv_dtype, TierKvDtype::kFp8E4M3);
  EXPECT_EQ(c.tiers.host.kv_dtype, TierKvDtype::kFp8E4M3);
  EXPECT_EQ(c.tiers.nvme.read_gbps, 6.5);
  EXPECT_EQ(c.tiers.nvme.write_gbps, 3.25);
  EXPECT_EQ(c.tiers.nvme.pause_after_failed_writes, 0u);
  EXPECT_EQ(c.tiers.nvme.pause_after_failed_reads, 3u);
  EXPECT_EQ(c.tiers.nvme.pause_ms, 2500u);
  EXPECT_EQ(c.tiers.nvme.io_timeout_ms, 750u);
  EXPECT_EQ(c.tiers.nvme.out_of_service_after_failures, 20u);
  EXPECT_EQ(c.tiers.nvme.readmit_after_ms, 4000u);
  EXPECT_EQ(c.tiers.nvme.watermarks.low, 0.3);
  EXPECT_EQ(c.tiers.nvme.watermarks.high, 0.8);
  EXPECT_EQ(c.policies.eviction, EvictionPolicy::kS3Fifo);
  EXPECT_EQ(c.policies.write, WritePolicy::kWriteThroughSelective);
  EXPECT_EQ(c.policies.write_selective_hits, 5u);
  EXPECT_EQ(c.policies.admission.nvme_min_hits, 3u);
  EXPECT_EQ(c.policies.prefetch.depth, 9u);
  EXPECT_FALSE(c.policies.prefetch.layerwise);
  EXPECT_EQ(c.policies.prefetch.layer_window, 2u);
  EXPECT_EQ(c.policies.prefetch.deadline_ms, 50u);
  EXPECT_EQ(c.policies.prefetch.on_late, LatePolicy::kRecompute);
  EXPECT_EQ(c.policies.prefill_tokens_per_s, 1234.5);
  EXPECT_EQ(c.metrics.listen, "0.0.0.0:1234");
  EXPECT_EQ(c.metrics.latency_buckets, (std::vector<double>{0.5, 2.0}));
}

TEST(Keys, AFileNamesOnlyWhatItChanges) {
  auto r = parse("tiers:\n  host:\n    capacity: 8GiB\n");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Config expected;
  expected.tiers.host.capacity_bytes = 8ull << 30;
  EXPECT_TRUE(*r == expected);
}

TEST(Keys, MetricsCanBeTurnedOff) {
  for (std::string_view text :
       {"metrics: {listen: off}", "metrics: {listen: \"\"}", "metrics:\n  listen:\n"}) {
    auto r = parse(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(r->metrics.listen, "") << text;
  }
}

TEST(Keys, NumaAutoOrANode) {
  auto a = parse("tiers: {host: {numa: auto}}");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tiers.host.numa_node, -1);
  auto n = parse("tiers: {host: {numa: 3}}");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->tiers.host.numa_node, 3);
  EXPECT_THAT(error_of(parse("tiers: {host: {numa: near}}")),
              HasSubstr("tiers.host.numa: expected auto or a NUMA node number, got \"near\""));
}

// ---------------------------------------------------------------------------------------------
// Errors: each names file:line:col (1-based) and the key path
// ---------------------------------------------------------------------------------------------

TEST(Errors, UnknownKeySuggestsTheNearestAndListsTheValidOnes) {
  const std::string m =
      error_of(parse("model:\n  layers: 32\ntiers:\n  host:\n    capcity: 4GiB\n"));
  EXPECT_EQ(m,
            "t.yaml:5:5: tiers.host.capcity: unknown key; did you mean \"capacity\"? (valid keys "
            "under tiers.host: capacity, numa, huge_pages, lock_memory, kv_dtype, watermarks)");
}

TEST(Errors, UnknownTopLevelKey) {
  EXPECT_THAT(error_of(parse("modle:\n  layers: 4\n")),
              StartsWith("t.yaml:1:1: modle: unknown key; did you mean \"model\"? (valid keys at "
                         "the top: model, tiers, policies, metrics)"));
}

TEST(Errors, UnknownKeyFarFromAnyGetsNoGuess) {
  const std::string m = error_of(parse("tiers:\n  nvme:\n    zebra: 1\n"));
  EXPECT_THAT(m, StartsWith("t.yaml:3:5: tiers.nvme.zebra: unknown key (valid keys under "));
  EXPECT_THAT(m, Not(HasSubstr("did you mean")));
}

TEST(Errors, WrongTypes) {
  EXPECT_EQ(error_of(parse("model:\n  layers: \"32\"\n")),
            "t.yaml:2:11: model.layers: expected an integer >= 0, got the string \"32\"");
  EXPECT_EQ(error_of(parse("model:\n  layers: abc\n")),
            "t.yaml:2:11: model.layers: expected an integer >= 0, got \"abc\"");
  EXPECT_EQ(error_of(parse("model:\n  layers: 1.5\n")),
            "t.yaml:2:11: model.layers: expected an integer >= 0, got \"1.5\"");
  EXPECT_EQ(error_of(parse("model:\n  layers: -3\n")),
            "t.yaml:2:11: model.layers: \"-3\" is negative; expected an integer >= 0");
  EXPECT_EQ(error_of(parse("model:\n  layers: 99999999999\n")),
            "t.yaml:2:11: model.layers: \"99999999999\" is too large; the most is 4294967295");
  EXPECT_EQ(error_of(parse("model:\n  layers: [1, 2]\n")),
            "t.yaml:2:11: model.layers: expected an integer >= 0, got a list");
  EXPECT_EQ(error_of(parse("model:\n  layers:\n")),
            "t.yaml:2:3: model.layers: expected an integer >= 0, got nothing");
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    capacity: {a: 1}\n")),
            "t.yaml:3:15: tiers.host.capacity: expected a size such as 512MiB, 64GiB or 1.5TB, "
            "got a map");
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    huge_pages: yes\n")),
            "t.yaml:3:17: tiers.host.huge_pages: expected true or false, got \"yes\" (YAML 1.1 "
            "words such as yes/no/on/off are not accepted)");
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    link_gbps: fast\n")),
            "t.yaml:3:16: tiers.hbm.link_gbps: expected a number, got \"fast\"");
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    link_gbps: .inf\n")),
            "t.yaml:3:16: tiers.hbm.link_gbps: expected a number, got \".inf\"");
  EXPECT_EQ(error_of(parse("model:\n  name: [a]\n")),
            "t.yaml:2:9: model.name: expected a string, got a list");
  EXPECT_EQ(error_of(parse("tiers:\n  nvme:\n    paths: [/a, [b]]\n")),
            "t.yaml:3:12: tiers.nvme.paths: entry 1: expected a string, got a list");
  EXPECT_EQ(error_of(parse("metrics:\n  latency_buckets: [0.1, x]\n")),
            "t.yaml:2:20: metrics.latency_buckets: entry 1: expected a number, got \"x\"");
}

TEST(Errors, SectionsMustBeMaps) {
  EXPECT_EQ(error_of(parse("tiers: 5\n")),
            "t.yaml:1:8: tiers: expected a map of keys (hbm, host, nvme), got a value");
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    watermarks: [0.5, 0.9]\n")),
            "t.yaml:3:17: tiers.hbm.watermarks: expected a map of keys (low, high), got a list");
  EXPECT_EQ(error_of(parse("- a\n- b\n")),
            "t.yaml:1:1: expected a map of keys (model, tiers, policies, metrics), got a list");
}

TEST(Errors, SizeWithoutAValidUnit) {
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    capacity: \"4 GB\"\n")),
            "t.yaml:3:15: tiers.host.capacity: \"4 GB\" is not a size: no space is allowed "
            "between number and unit (write 4GB)");
  EXPECT_THAT(error_of(parse("tiers:\n  hbm:\n    capacity: 4gib\n")),
              StartsWith("t.yaml:3:15: tiers.hbm.capacity: \"4gib\" is not a size: unknown unit "
                         "\"gib\" (units are case-sensitive; did you mean GiB?)"));
  EXPECT_THAT(error_of(parse("tiers:\n  nvme:\n    capacity: 2 terabytes\n")),
              StartsWith("t.yaml:3:15: tiers.nvme.capacity: \"2 terabytes\" is not a size:"));
}

TEST(Errors, ZeroCapacity) {
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    capacity: 0\n")),
            "t.yaml:3:15: tiers.hbm.capacity: must be greater than 0 bytes");
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    capacity: 0GiB\n")),
            "t.yaml:3:15: tiers.host.capacity: must be greater than 0 bytes");
  EXPECT_EQ(error_of(parse("tiers:\n  nvme:\n    capacity: 0B\n")),
            "t.yaml:3:15: tiers.nvme.capacity: must be greater than 0 bytes (or set "
            "tiers.nvme.enabled: false)");
  // A disabled store needs no capacity.
  EXPECT_TRUE(parse("tiers:\n  nvme:\n    enabled: false\n    capacity: 0\n").ok());
}

TEST(Errors, NegativeCapacity) {
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    capacity: -4GiB\n")),
            "t.yaml:3:15: tiers.host.capacity: \"-4GiB\" is not a size: sizes cannot be negative");
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    capacity: -1\n")),
            "t.yaml:3:15: tiers.hbm.capacity: \"-1\" is not a size: sizes cannot be negative");
}

TEST(Errors, CapacitySmallerThanOneFrame) {
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    capacity: 32KiB\n")),
            "t.yaml:3:15: tiers.hbm.capacity: 32KiB holds no frame: one page of the model takes "
            "64KiB");
}

TEST(Errors, WatermarksOutsideTheUnitIntervalOrCrossed) {
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    watermarks: {low: 0, high: 0.9}\n")),
            "t.yaml:3:23: tiers.hbm.watermarks.low: 0 is outside (0, 1]; a watermark is a "
            "fraction of the tier's capacity");
  EXPECT_EQ(error_of(parse("tiers:\n  host:\n    watermarks:\n      high: 1.5\n")),
            "t.yaml:4:13: tiers.host.watermarks.high: 1.5 is outside (0, 1]; a watermark is a "
            "fraction of the tier's capacity");
  EXPECT_THAT(error_of(parse("tiers:\n  nvme:\n    watermarks: {low: -0.1}\n")),
              StartsWith("t.yaml:3:23: tiers.nvme.watermarks.low: -0.1 is outside (0, 1]"));
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    watermarks: {low: 0.9, high: 0.5}\n")),
            "t.yaml:3:23: tiers.hbm.watermarks.low: low (0.9) is above high (0.5); demotion "
            "starts above high and stops at low, so low must be <= high");
  EXPECT_TRUE(parse("tiers:\n  hbm:\n    watermarks: {low: 1, high: 1}\n").ok());
}

TEST(Errors, PageSizeNotAMultipleOf512UnderDirectIo) {
  // 2 x 1 token x 1 head x 64 x 1 byte = 128 bytes.
  const char* small =
      "model:\n  kv_heads: 1\n  head_dim: 64\n  dtype: fp8_e4m3\n  page_tokens: 1\n";
  const std::string m = error_of(parse(small));
  EXPECT_THAT(m, StartsWith("t.yaml:5:16: model.page_tokens: a page of 2 x 1 tokens x 1 kv heads x "
                            "64 x 1 bytes (fp8_e4m3) is 128 bytes, not a multiple of 512 as "
                            "O_DIRECT needs"));
  // Without direct I/O the same geometry is fine, and the error points at direct_io when that is
  // the line the file set.
  EXPECT_TRUE(parse(std::string(small) + "tiers: {nvme: {direct_io: false}}\n").ok());
  EXPECT_THAT(error_of(parse_config(std::string("tiers:\n  nvme:\n    direct_io: true\n") +
                                        "model: {kv_heads: 1, head_dim: 64, dtype: fp8_e4m3, "
                                        "page_tokens: 1}\n",
                                    "t.yaml")),
              StartsWith("t.yaml:3:16: tiers.nvme.direct_io: a page of"));
}

TEST(Errors, AnFp8HostTierNeedsAnFp8NvmeTier) {
  const std::string m = error_of(parse("tiers:\n  host:\n    kv_dtype: fp8_e4m3\n"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.kv_dtype: is model, but tiers.host.kv_dtype is fp8_e4m3"));
  EXPECT_THAT(m, HasSubstr("set tiers.nvme.kv_dtype: fp8_e4m3"));
  EXPECT_TRUE(parse("tiers: {host: {kv_dtype: fp8_e4m3}, nvme: {kv_dtype: fp8_e4m3}}\n").ok());
  EXPECT_TRUE(parse("tiers: {host: {kv_dtype: fp8_e4m3}, nvme: {enabled: false}}\n").ok());
  EXPECT_TRUE(parse("tiers: {nvme: {kv_dtype: fp8_e4m3}}\n").ok());
  // A model already in fp8 is held as computed everywhere: nothing to widen.
  EXPECT_TRUE(parse("model: {dtype: fp8_e4m3}\ntiers: {host: {kv_dtype: fp8_e4m3}}\n").ok());
}

TEST(Errors, UnknownEnumValuesListTheValidOnes) {
  EXPECT_EQ(error_of(parse("policies:\n  eviction: lru2\n")),
            "t.yaml:2:13: policies.eviction: unknown value \"lru2\"; did you mean \"lru\"? (valid "
            "values: lru, lfu, s3fifo, prefix_aware, lookahead)");
  EXPECT_EQ(error_of(parse("policies:\n  write: sometimes\n")),
            "t.yaml:2:10: policies.write: unknown value \"sometimes\" (valid values: "
            "write_through, write_back, write_through_selective)");
  EXPECT_THAT(error_of(parse("model:\n  dtype: bfloat16\n")),
              HasSubstr("(valid values: f32, f16, bf16, fp8_e4m3)"));
  EXPECT_THAT(error_of(parse("tiers:\n  hbm:\n    backend: gpu\n")),
              HasSubstr("(valid values: auto, cuda, emulated)"));
  EXPECT_THAT(error_of(parse("tiers:\n  nvme:\n    checksum: crc32\n")),
              HasSubstr("did you mean \"crc32c\"? (valid values: xxh3, crc32c)"));
  EXPECT_THAT(
      error_of(parse("tiers:\n  nvme:\n    kv_dtype: fp8-e4m3\n")),
      HasSubstr("tiers.nvme.kv_dtype: unknown value \"fp8-e4m3\"; did you mean \"fp8_e4m3\"? "
                "(valid values: model, fp8_e4m3)"));
  EXPECT_THAT(error_of(parse("policies:\n  prefetch:\n    on_late: wait\n")),
              HasSubstr("(valid values: stall, recompute)"));
}

TEST(Errors, OutOfRangeValuesNameTheirKey) {
  EXPECT_EQ(error_of(parse("model:\n  layers: 0\n")),
            "t.yaml:2:11: model.layers: 0 is out of range; it must be in 1..1024");
  EXPECT_EQ(error_of(parse("model:\n  head_dim: 100\n")),
            "t.yaml:2:13: model.head_dim: 100 must be a multiple of 8 in 8..1024");
  EXPECT_EQ(error_of(parse("tiers:\n  nvme:\n    queue_depth: 5000\n")),
            "t.yaml:3:18: tiers.nvme.queue_depth: 5000 is out of range; it must be in 1..4096");
  EXPECT_THAT(error_of(parse("metrics:\n  latency_buckets: [0.1, 0.1]\n")),
              StartsWith("t.yaml:2:20: metrics.latency_buckets: entry 1 (0.1) is not above"));
  EXPECT_THAT(error_of(parse("metrics:\n  listen: localhost\n")),
              StartsWith("t.yaml:2:11: metrics.listen: \"localhost\" is not a listen address"));
  EXPECT_THAT(error_of(parse("policies:\n  prefetch: {deadline_ms: 0}\n")),
              StartsWith("t.yaml:2:27: policies.prefetch.deadline_ms: must be at least 1"));
}

TEST(Errors, AllValidationProblemsAreReportedTogether) {
  const std::string m = error_of(parse("model: {layers: 0}\ntiers: {hbm: {device: 300}}\n"));
  EXPECT_THAT(m, HasSubstr("t.yaml:1:17: model.layers: 0 is out of range"));
  EXPECT_THAT(m, HasSubstr("; t.yaml:2:23: tiers.hbm.device: 300 is out of range"));
}

TEST(Errors, MalformedYaml) {
  EXPECT_EQ(error_of(parse("model: [1,\n")),
            "t.yaml:2:1: malformed YAML: end of sequence flow not found");
  EXPECT_EQ(error_of(parse("model:\n  layers: 1\n   kv_heads: 2\n")),
            "t.yaml:3:12: malformed YAML: illegal map value");
  EXPECT_THAT(error_of(parse(std::string(5000, '['))), HasSubstr("malformed YAML"));
}

TEST(Errors, OneDocumentOnly) {
  EXPECT_EQ(error_of(parse("model: {layers: 2}\n---\nmodel: {layers: 3}\n")),
            "t.yaml:2:1: a configuration is one YAML document; more follows here");
  // yaml-cpp 0.7 never consumes a ',' at document level; loading must still end, with an error.
  EXPECT_EQ(error_of(parse(",")),
            "t.yaml:1:1: a configuration is one YAML document; more follows here");
  EXPECT_EQ(error_of(parse("model: {layers: 2}\n---\n,\n")),
            "t.yaml:2:1: a configuration is one YAML document; more follows here");
}

TEST(Errors, DuplicateKeys) {
  EXPECT_EQ(error_of(parse("model:\n  layers: 2\n  layers: 3\n")),
            "t.yaml:3:3: model.layers: duplicate key (first at t.yaml:2:3)");
}

TEST(Errors, KeysMustBeWords) {
  EXPECT_EQ(error_of(parse("? [a, b]\n: 1\n")),
            "t.yaml:1:3: keys must be words, not a list or a map");
}

// A dotted key is a second spelling of a nested one, and it slipped past duplicate detection
// (which compares the words of one map): `tiers.hbm.capacity: 3GiB` after `tiers: {hbm: ...}`.
TEST(Errors, DottedKeysAreRefused) {
  EXPECT_EQ(error_of(parse("tiers: {hbm: {capacity: 1GiB}}\ntiers.hbm.capacity: 3GiB\n")),
            "t.yaml:2:1: tiers.hbm.capacity: a key is one word, not a dotted path; write it "
            "nested: tiers: hbm: capacity:");
  EXPECT_EQ(error_of(parse("tiers:\n  hbm.capacity: 3GiB\n")),
            "t.yaml:2:3: tiers.hbm.capacity: a key is one word, not a dotted path; write it "
            "nested: tiers: hbm: capacity:");
  ConfigSources s = hermetic();
  s.overrides = {"tiers={hbm.capacity: 3GiB}"};
  EXPECT_EQ(error_of(load_config(s)),
            "--set tiers={hbm.capacity: 3GiB}: tiers.hbm.capacity: a key is one word, not a "
            "dotted path; write it nested: tiers: hbm: capacity:");
}

// An empty word named the section it is in, so `"": {...}` applied the whole document again.
TEST(Errors, EmptyKeysAreRefused) {
  EXPECT_EQ(error_of(parse("\"\": {tiers: {hbm: {capacity: 5GiB}}}\n")),
            "t.yaml:1:1: empty key (valid keys at the top: model, tiers, policies, metrics)");
  EXPECT_EQ(error_of(parse("tiers:\n  '': {hbm: {capacity: 5GiB}}\n")),
            "t.yaml:2:3: tiers: empty key (valid keys under tiers: hbm, host, nvme)");
  ConfigSources s = hermetic();
  s.overrides = {"tiers={'': {hbm: {capacity: 5GiB}}}"};
  EXPECT_EQ(error_of(load_config(s)),
            "--set tiers={'': {hbm: {capacity: 5GiB}}}: tiers: empty key (valid keys under "
            "tiers: hbm, host, nvme)");
}

// Tags were read by some value types only (`!!int lfu` was an enum, `!!int 16` not an integer,
// `!!binary` a string of base64): every explicit tag is refused, wherever it is.
TEST(Errors, ExplicitTagsAreRefused) {
  EXPECT_EQ(error_of(parse("tiers:\n  hbm:\n    capacity: !!str 2GiB\n")),
            "t.yaml:3:15: tiers.hbm.capacity: the YAML tag !!str is not accepted; write the "
            "value without a tag");
  EXPECT_EQ(error_of(parse("policies:\n  eviction: !!int lfu\n")),
            "t.yaml:2:13: policies.eviction: the YAML tag !!int is not accepted; write the value "
            "without a tag");
  EXPECT_EQ(error_of(parse("model:\n  layers: !!int 16\n")),
            "t.yaml:2:11: model.layers: the YAML tag !!int is not accepted; write the value "
            "without a tag");
  EXPECT_THAT(error_of(parse("model: {name: !!binary aGVsbG8=}\n")),
              HasSubstr("model.name: the YAML tag !!binary is not accepted"));
  EXPECT_THAT(error_of(parse("model: {name: !mine x}\n")),
              HasSubstr("model.name: the YAML tag !mine is not accepted"));
  EXPECT_THAT(error_of(parse("model: {name: !<tag:example.com,2024:x> x}\n")),
              HasSubstr("model.name: the YAML tag !<tag:example.com,2024:x> is not accepted"));
  EXPECT_THAT(error_of(parse("tiers: {nvme: {paths: [/a.kvs, !!str /b.kvs]}}\n")),
              HasSubstr("tiers.nvme.paths: the YAML tag !!str is not accepted"));
  EXPECT_THAT(error_of(parse("tiers: !!map {hbm: {capacity: 2GiB}}\n")),
              HasSubstr("tiers: the YAML tag !!map is not accepted"));
  EXPECT_THAT(error_of(parse("model: {!!str layers: 2}\n")),
              HasSubstr("model.layers: the YAML tag !!str is not accepted"));
  EXPECT_THAT(error_of(parse("!!map {model: {layers: 2}}\n")),
              HasSubstr("t.yaml:1:1: the YAML tag !!map is not accepted"));
  ConfigSources s = hermetic({{"KVTIER_MODEL__LAYERS", "!!int 16"}});
  EXPECT_EQ(error_of(load_config(s)),
            "environment KVTIER_MODEL__LAYERS=!!int 16: model.layers: the YAML tag !!int is not "
            "accepted; write the value without a tag");
  // The non-specific tag "!" makes a plain string, like quotes.
  auto r = parse("model: {name: ! 16, namespace: \"7\"}\n");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model.name, "16");
  EXPECT_EQ(r->model.key_namespace, "7");
}

// Values of --set and of the environment are one YAML document, as a file is: yaml-cpp's Load
// read the first and dropped the rest.
TEST(Errors, OverrideValuesAreOneDocument) {
  ConfigSources s = hermetic();
  s.overrides = {"model.name=a\n---\nb"};
  EXPECT_EQ(error_of(load_config(s)),
            "--set model.name=a?---?b: model.name: the value is more than one YAML document; "
            "quote it if it holds a line \"---\" or \"...\"");
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_MODEL__NAME", "a\n...\nb"}}))),
            "environment KVTIER_MODEL__NAME=a?...?b: model.name: the value is more than one "
            "YAML document; quote it if it holds a line \"---\" or \"...\"");
  s.overrides = {"model.name=\"a\\n---\\nb\"", "model.namespace=x,y"};
  auto r = load_config(s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model.name, "a\n---\nb");
  EXPECT_EQ(r->model.key_namespace, "x,y");
}

// A FIFO blocked the loader in open() until a writer came, forever if none did; a device is no
// configuration either.
TEST(Errors, AConfigurationFileIsARegularFile) {
  TempDir dir;
  const std::string fifo = (dir.path() / "fifo.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ConfigSources s = hermetic();
  s.file = fifo;
  auto loading = std::async(std::launch::async, [&s] { return load_config(s); });
  if (loading.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "loading a FIFO hangs";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // unblocks it
    if (writer >= 0) ::close(writer);
  }
  const Result<Config> r = loading.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            fifo + ": not a regular file (a FIFO); a configuration is read from a regular file");
  s.file = "/dev/null";
  EXPECT_EQ(error_of(load_config(s)),
            "/dev/null: not a regular file (a character device); a configuration is read from a "
            "regular file");
  // Through the environment's KVTIER_CONFIG_FILE too.
  EXPECT_THAT(error_of(load_config(hermetic({{"KVTIER_CONFIG_FILE", "/dev/null"}}))),
              StartsWith("/dev/null: not a regular file"));
}

TEST(Errors, MissingFile) {
  TempDir dir;
  ConfigSources s = hermetic();
  s.file = (dir.path() / "absent.yaml").string();
  auto r = load_config(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), *s.file + ": cannot open: No such file or directory (errno 2)");
}

TEST(Errors, UnreadableFile) {
  TempDir dir;
  ConfigSources s = hermetic();
  s.file = dir.path().string();  // a directory opens but cannot be read
  auto r = load_config(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_EQ(r.status().message(), *s.file + ": cannot read: Is a directory (errno 21)");
}

TEST(Errors, ErrorsInAFileNameThatFile) {
  TempDir dir;
  ConfigSources s = hermetic();
  s.file = dir.write("x.yaml", "# a comment\ntiers:\n  host:\n    capacity: 4 GB\n");
  EXPECT_THAT(error_of(load_config(s)),
              StartsWith(*s.file + ":4:15: tiers.host.capacity: \"4 GB\" is not a size:"));
}

TEST(Errors, BadOverrides) {
  auto with = [](std::vector<std::string> overrides) {
    ConfigSources s = hermetic();
    s.overrides = std::move(overrides);
    return load_config(s);
  };
  EXPECT_EQ(error_of(with({"tiers.host.capacity"})),
            "--set tiers.host.capacity: expected key.path=value (e.g. --set "
            "tiers.host.capacity=8GiB)");
  EXPECT_EQ(error_of(with({"tiers.hots.capacity=1GiB"})),
            "--set tiers.hots.capacity=1GiB: tiers.hots: unknown key; did you mean \"host\"? "
            "(valid keys under tiers: hbm, host, nvme)");
  EXPECT_EQ(error_of(with({"tiers.host.capacity=abc"})),
            "--set tiers.host.capacity=abc: tiers.host.capacity: \"abc\" is not a size: it must "
            "start with a number, e.g. 512MiB, 64GiB or 1.5TB");
  EXPECT_EQ(error_of(with({"model.layers.x=1"})),
            "--set model.layers.x=1: model.layers is a key, not a section");
  EXPECT_EQ(error_of(with({"=1"})), "--set =1: the key path is empty");
  EXPECT_EQ(error_of(with({"model..layers=1"})),
            "--set model..layers=1: model.: unknown key (valid keys under model: name, "
            "namespace, layers, kv_heads, head_dim, dtype, page_tokens)");
  EXPECT_THAT(error_of(with({"tiers.nvme.paths=[a"})),
              StartsWith("--set tiers.nvme.paths=[a: tiers.nvme.paths: value is not valid YAML"));
  EXPECT_EQ(error_of(with({"model.layers=0"})),
            "--set model.layers=0: model.layers: 0 is out of range; it must be in 1..1024");
  EXPECT_EQ(error_of(with({"tiers=1"})),
            "--set tiers=1: tiers: expected a map of keys (hbm, host, nvme), got a value");
}

TEST(Errors, BadEnvironmentOverrides) {
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_TIERS__HOST__CAPCITY", "1GiB"}}))),
            "environment KVTIER_TIERS__HOST__CAPCITY=1GiB: tiers.host.capcity: unknown key; did "
            "you mean \"capacity\"? (valid keys under tiers.host: capacity, numa, huge_pages, "
            "lock_memory, kv_dtype, watermarks)");
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_MODEL__LAYERS", "many"}}))),
            "environment KVTIER_MODEL__LAYERS=many: model.layers: expected an integer >= 0, got "
            "\"many\"");
}

// The README spells key variables in upper case; lower or mixed case and dots were accepted, and
// two spellings of one key were then resolved silently by the order of their names.
TEST(Errors, KeyVariablesAreUpperCaseLettersDigitsAndUnderscores) {
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_tiers__hbm__capacity", "1GiB"}}))),
            "environment KVTIER_tiers__hbm__capacity=1GiB: a key variable is spelled in upper "
            "case: A-Z, 0-9 and _ after KVTIER_ (KVTIER_TIERS__HBM__CAPACITY)");
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_TIERS__HBM.CAPACITY", "1GiB"}}))),
            "environment KVTIER_TIERS__HBM.CAPACITY=1GiB: a key variable is spelled in upper "
            "case: A-Z, 0-9 and _ after KVTIER_ (KVTIER_TIERS__HBM__CAPACITY)");
  EXPECT_THAT(error_of(load_config(hermetic({{"KVTIER_TIERS__HBM__CAPACITY", "3GiB"},
                                             {"KVTIER_Tiers__Hbm__Capacity", "1GiB"}}))),
              StartsWith("environment KVTIER_Tiers__Hbm__Capacity=1GiB: a key variable is "
                         "spelled in upper case"));
  EXPECT_THAT(error_of(load_config(hermetic({{"KVTIER_MODEL__NAME-X", "a"}}))),
              StartsWith("environment KVTIER_MODEL__NAME-X=a: a key variable is spelled in "
                         "upper case: A-Z, 0-9 and _ after KVTIER_"));
}

TEST(Errors, KeyVariablesThatOverlapAreRefused) {
  // A section and a key inside it: which won depended on the sort order of their names.
  EXPECT_EQ(error_of(load_config(hermetic({{"KVTIER_TIERS__HBM", "{capacity: 1GiB}"},
                                           {"KVTIER_TIERS__HBM__CAPACITY", "2GiB"}}))),
            "environment KVTIER_TIERS__HBM (tiers.hbm) and KVTIER_TIERS__HBM__CAPACITY "
            "(tiers.hbm.capacity) overlap: the first sets the section that holds the second; set "
            "each key with one variable");
  // Also when the section's value does not name the key: the rule is about names, not values.
  EXPECT_THAT(error_of(load_config(hermetic({{"KVTIER_TIERS__HOST", "{numa: 1}"},
                                             {"KVTIER_TIERS__HOST__WATERMARKS__LOW", "0.5"}}))),
              StartsWith("environment KVTIER_TIERS__HOST (tiers.host) and "
                         "KVTIER_TIERS__HOST__WATERMARKS__LOW (tiers.host.watermarks.low) "
                         "overlap"));
  // Siblings and names that only share a prefix of characters do not overlap.
  auto r = load_config(hermetic({{"KVTIER_TIERS__HBM__CAPACITY", "2GiB"},
                                 {"KVTIER_TIERS__HBM__WATERMARKS", "{low: 0.5, high: 0.6}"},
                                 {"KVTIER_POLICIES__WRITE", "write_back"},
                                 {"KVTIER_POLICIES__WRITE_SELECTIVE_HITS", "3"}}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tiers.hbm.capacity_bytes, 2ull << 30);
  EXPECT_EQ(r->policies.write_selective_hits, 3u);
}

TEST(Errors, ValidationPointsAtTheLayerThatSetTheKey) {
  TempDir dir;
  ConfigSources s = hermetic({{"KVTIER_MODEL__KV_HEADS", "1"}});
  s.file = dir.write("g.yaml", "model:\n  head_dim: 64\n  dtype: fp8_e4m3\n");
  s.overrides = {"model.page_tokens=1"};
  // The last layer that touched the geometry is the override: it is named first.
  EXPECT_THAT(error_of(load_config(s)),
              StartsWith("--set model.page_tokens=1: model.page_tokens: a page of 2 x 1 tokens"));
  s.overrides = {"tiers.hbm.watermarks.high=0.5"};
  EXPECT_EQ(error_of(load_config(s)),
            "--set tiers.hbm.watermarks.high=0.5: tiers.hbm.watermarks.high: low (0.85) is "
            "above high (0.5); demotion starts above high and stops at low, so low must be <= "
            "high");
}

// ---------------------------------------------------------------------------------------------
// Precedence: embedded default < file < environment < --set
// ---------------------------------------------------------------------------------------------

TEST(Precedence, DefaultFileEnvironmentOverride) {
  TempDir dir;
  const std::string file = dir.write("p.yaml", "tiers:\n  host:\n    capacity: 8GiB\n");
  const std::string env_file = dir.write("e.yaml", "tiers:\n  host:\n    capacity: 2GiB\n");
  auto host_capacity = [](const ConfigSources& s) -> uint64_t {
    auto r = load_config(s);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->tiers.host.capacity_bytes : 0;
  };
  ConfigSources s = hermetic();
  EXPECT_EQ(host_capacity(s), 4ull << 30);  // embedded default

  s.environment = {{"KVTIER_CONFIG_FILE", env_file}};
  EXPECT_EQ(host_capacity(s), 2ull << 30);  // the file named by the environment

  s.file = file;
  EXPECT_EQ(host_capacity(s), 8ull << 30);  // --config beats KVTIER_CONFIG_FILE

  (*s.environment)["KVTIER_TIERS__HOST__CAPACITY"] = "16GiB";
  EXPECT_EQ(host_capacity(s), 16ull << 30);  // environment beats the file

  s.overrides = {"tiers.host.capacity=32GiB"};
  EXPECT_EQ(host_capacity(s), 32ull << 30);  // --set beats the environment

  s.overrides.push_back("tiers.host.capacity=64GiB");
  EXPECT_EQ(host_capacity(s), 64ull << 30);  // the last --set wins

  s.use_environment = false;
  s.overrides.clear();
  EXPECT_EQ(host_capacity(s), 8ull << 30);  // no environment: the file alone
}

TEST(Precedence, LayersOnlyChangeTheKeysTheyName) {
  TempDir dir;
  ConfigSources s = hermetic({{"KVTIER_POLICIES__EVICTION", "lfu"}});
  s.file = dir.write("p.yaml", "model:\n  layers: 40\n");
  s.overrides = {"tiers.hbm.capacity=2GiB"};
  auto r = load_config(s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Config expected;
  expected.model.geometry.layers = 40;
  expected.policies.eviction = EvictionPolicy::kLfu;
  expected.tiers.hbm.capacity_bytes = 2ull << 30;
  EXPECT_TRUE(*r == expected);
}

TEST(Precedence, VariablesThatAreNotKeysAreIgnored) {
  auto r = load_config(hermetic({{"KVTIER_LOG_LEVEL", "debug"},
                                 {"KVTIER_SOURCE_DIR", "/x"},
                                 {"OTHER__THING", "1"},
                                 {"KVTIER_CONFIG_FILE", ""}}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(*r == Config{});
}

// ---------------------------------------------------------------------------------------------
// Override value forms and the cache directory
// ---------------------------------------------------------------------------------------------

TEST(Overrides, ValuesAreYaml) {
  ConfigSources s = hermetic();
  s.overrides = {"tiers.hbm.watermarks={low: 0.5, high: 0.7}", "tiers.nvme.paths=[/a.kvs, /b.kvs]",
                 "metrics.listen=off", "model.name=my model", "policies.prefetch.layerwise=false"};
  auto r = load_config(s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tiers.hbm.watermarks.low, 0.5);
  EXPECT_EQ(r->tiers.hbm.watermarks.high, 0.7);
  EXPECT_EQ(r->tiers.nvme.paths, (std::vector<std::string>{"/a.kvs", "/b.kvs"}));
  EXPECT_EQ(r->metrics.listen, "");
  EXPECT_EQ(r->model.name, "my model");
  EXPECT_FALSE(r->policies.prefetch.layerwise);

  s.overrides = {"tiers.nvme.paths=/mnt/one.kvs"};  // a lone path is a list of one
  auto one = load_config(s);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->tiers.nvme.paths, std::vector<std::string>{"/mnt/one.kvs"});
}

TEST(CacheDir, ExpandsFromTheEnvironmentOrDefaults) {
  auto paths = [](std::map<std::string, std::string> env, std::vector<std::string> overrides) {
    ConfigSources s = hermetic(std::move(env));
    s.overrides = std::move(overrides);
    auto r = load_config(s);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->tiers.nvme.paths : std::vector<std::string>{};
  };
  EXPECT_EQ(paths({}, {}), std::vector<std::string>{"./.kvtier/store0.kvs"});
  EXPECT_EQ(paths({{"KVTIER_CACHE_DIR", "/var/cache/kv/"}}, {}),
            std::vector<std::string>{"/var/cache/kv/store0.kvs"});
  EXPECT_EQ(paths({{"KVTIER_CACHE_DIR", ""}}, {}),
            std::vector<std::string>{"./.kvtier/store0.kvs"});
  EXPECT_EQ(paths({{"KVTIER_CACHE_DIR", "/c"}},
                  {"tiers.nvme.paths=[\"${KVTIER_CACHE_DIR}/a.kvs\", /fixed/b.kvs]"}),
            (std::vector<std::string>{"/c/a.kvs", "/fixed/b.kvs"}));
  // A file that names its own paths is not redirected by KVTIER_CACHE_DIR.
  EXPECT_EQ(paths({{"KVTIER_CACHE_DIR", "/c"}}, {"tiers.nvme.paths=/dev/nvme1n1"}),
            std::vector<std::string>{"/dev/nvme1n1"});
  // Without the environment, the default directory.
  ConfigSources s;
  s.use_environment = false;
  s.environment = std::map<std::string, std::string>{{"KVTIER_CACHE_DIR", "/c"}};
  auto r = load_config(s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tiers.nvme.paths, std::vector<std::string>{"./.kvtier/store0.kvs"});
}

TEST(CacheDir, OtherVariablesAreErrors) {
  EXPECT_EQ(error_of(parse("tiers:\n  nvme:\n    paths: [\"${HOME}/x.kvs\"]\n")),
            "t.yaml:3:12: tiers.nvme.paths: \"${HOME}/x.kvs\": \"${HOME}\" is not expanded; "
            "only ${KVTIER_CACHE_DIR} is");
}

}  // namespace
}  // namespace kvtier
