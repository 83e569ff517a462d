// The semantic rules, applied to Configs built in code (the loader tests cover the same rules as
// they reach a YAML user, with file:line:col).
#include "runtime/config_validate.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "runtime/config_sizing.hpp"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string problems(const Config& c) {
  Status s = validate_config(c);
  return s.ok() ? std::string() : s.message();
}

TEST(Validate, TheDefaultIsValid) {
  EXPECT_TRUE(validate_config(Config{}).ok());
  EXPECT_THAT(find_config_issues(Config{}), IsEmpty());
}

TEST(Validate, CapacitiesMustBePositive) {
  Config c;
  c.tiers.hbm.capacity_bytes = 0;
  c.tiers.host.capacity_bytes = 0;
  c.tiers.nvme.capacity_bytes = 0;
  const std::string m = problems(c);
  EXPECT_THAT(m, HasSubstr("tiers.hbm.capacity: must be greater than 0 bytes"));
  EXPECT_THAT(m, HasSubstr("tiers.host.capacity: must be greater than 0 bytes"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.capacity: must be greater than 0 bytes"));
  c.tiers.nvme.enabled = false;
  EXPECT_THAT(problems(c), Not(HasSubstr("tiers.nvme.capacity")));
}

TEST(Validate, EachTierHoldsAtLeastOneFrameAndAtMostTheIndexLimit) {
  Config c;
  c.tiers.host.capacity_bytes = 65535;  // one byte short of a 64 KiB page
  EXPECT_EQ(problems(c),
            "tiers.host.capacity: 65535B holds no frame: one page of the model takes 64KiB");
  c.tiers.host.capacity_bytes = 65536;
  EXPECT_TRUE(validate_config(c).ok());
  c.model.geometry = Geometry{1, 1, 8, Dtype::kFP8E4M3, 32};  // 512-byte pages, 4 KiB frames
  c.tiers.host.capacity_bytes = uint64_t{1} << 50;            // 2^38 frames
  EXPECT_THAT(problems(c), HasSubstr("tiers.host.capacity: 1PiB holds 274877906944 frames, more "
                                     "than the 4294967293 one tier can index"));
}

TEST(Validate, NvmeNeedsRoomForASuperblockAndAnExtentPerPath) {
  Config c;
  c.tiers.nvme.paths = {"/a", "/b"};
  c.tiers.nvme.capacity_bytes = 4ull << 20;  // 2 MiB per file: not a superblock + 2 MiB block
  EXPECT_THAT(problems(c), HasSubstr("tiers.nvme.capacity: 4MiB over 2 path(s) leaves 2MiB per "
                                     "file, less than one block extent (2052KiB)"));
  c.tiers.nvme.capacity_bytes = 1ull << 30;
  EXPECT_TRUE(validate_config(c).ok());
}

TEST(Validate, Watermarks) {
  for (double bad : {0.0, -0.5, 1.0000001, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Config c;
    c.tiers.nvme.watermarks.high = bad;
    EXPECT_THAT(problems(c), HasSubstr("tiers.nvme.watermarks.high: ")) << bad;
    EXPECT_THAT(problems(c), HasSubstr(" is outside (0, 1]")) << bad;
  }
  Config c;
  c.tiers.host.watermarks = {0.96, 0.95};
  EXPECT_THAT(problems(c), HasSubstr("tiers.host.watermarks.low: low (0.96) is above high (0.95)"));
  c.tiers.host.watermarks = {0.95, 0.95};
  EXPECT_TRUE(validate_config(c).ok());
  // A disabled store's watermarks are not judged.
  c.tiers.nvme.enabled = false;
  c.tiers.nvme.watermarks = {2, 3};
  EXPECT_TRUE(validate_config(c).ok());
}

TEST(Validate, DirectIoNeedsPagesOf512ByteMultiples) {
  Config c;
  c.model.geometry = Geometry{32, 1, 64, Dtype::kFP8E4M3, 1};  // 128-byte pages
  c.tiers.hbm.capacity_bytes = 1 << 20;
  const auto issues = find_config_issues(c);
  ASSERT_EQ(issues.size(), 1u) << problems(c);
  EXPECT_EQ(issues[0].keys.front(), "tiers.nvme.direct_io");
  EXPECT_THAT(issues[0].keys, ::testing::Contains("model.page_tokens"));
  EXPECT_THAT(issues[0].message, HasSubstr("is 128 bytes, not a multiple of 512"));
  c.tiers.nvme.direct_io = false;
  EXPECT_TRUE(validate_config(c).ok()) << problems(c);
  c.tiers.nvme.direct_io = true;
  c.model.geometry.page_tokens = 4;  // 512 bytes
  EXPECT_TRUE(validate_config(c).ok()) << problems(c);
}

TEST(Validate, GeometryBounds) {
  Config c;
  c.model.geometry.layers = 1025;
  c.model.geometry.kv_heads = 0;
  c.model.geometry.head_dim = 12;
  c.model.geometry.page_tokens = 0;
  c.model.name.clear();
  const std::string m = problems(c);
  EXPECT_THAT(m, HasSubstr("model.name: must not be empty"));
  EXPECT_THAT(m, HasSubstr("model.layers: 1025 is out of range; it must be in 1..1024"));
  EXPECT_THAT(m, HasSubstr("model.kv_heads: 0 is out of range"));
  EXPECT_THAT(m, HasSubstr("model.head_dim: 12 must be a multiple of 8 in 8..1024"));
  EXPECT_THAT(m, HasSubstr("model.page_tokens: 0 is out of range"));
}

TEST(Validate, BlocksAreAtMostOneGiB) {
  Config c;
  c.model.geometry = Geometry{1024, 64, 256, Dtype::kF32, 16};  // 2 MiB pages, 2 GiB blocks
  c.tiers.hbm.capacity_bytes = 1ull << 30;
  EXPECT_THAT(problems(c), HasSubstr("model.page_tokens: a block (1024 layers x 2MiB pages) is "
                                     "2GiB, above the 1GiB limit"));
}

TEST(Validate, NvmePaths) {
  Config c;
  c.tiers.nvme.paths = {};
  EXPECT_THAT(problems(c), HasSubstr("tiers.nvme.paths: is empty"));
  c.tiers.nvme.paths = {"/a", ""};
  EXPECT_THAT(problems(c), HasSubstr("tiers.nvme.paths: entry 1 is an empty path"));
  c.tiers.nvme.paths = {"/a", "/a"};
  EXPECT_THAT(problems(c), HasSubstr("tiers.nvme.paths: \"/a\" is listed twice"));
  c.tiers.nvme.paths = {"${KVTIER_CACHE_DIR}/s.kvs"};
  EXPECT_THAT(problems(c), HasSubstr("holds an unexpanded ${...}"));
}

TEST(Validate, QueuesThreadsAndPolicies) {
  Config c;
  c.tiers.nvme.queue_depth = 0;
  c.tiers.nvme.io_threads = 65;
  c.tiers.nvme.pause_ms = 0;
  c.tiers.nvme.io_timeout_ms = 600'001;
  c.tiers.nvme.readmit_after_ms = 3'600'001;
  c.tiers.hbm.device = -1;
  c.tiers.host.numa_node = -2;
  c.tiers.nvme.read_gbps = -1;
  c.tiers.hbm.link_gbps = std::numeric_limits<double>::infinity();
  c.policies.write_selective_hits = 0;
  c.policies.prefetch.layer_window = 0;
  c.policies.prefetch.deadline_ms = 0;
  c.policies.prefill_tokens_per_s = 0;
  const std::string m = problems(c);
  EXPECT_THAT(m, HasSubstr("tiers.nvme.queue_depth: 0 is out of range; it must be in 1..4096"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.io_threads: 65 is out of range; it must be in 1..64"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.pause_ms: 0 is out of range; it must be in 1..3600000"));
  EXPECT_THAT(
      m, HasSubstr("tiers.nvme.io_timeout_ms: 600001 is out of range; it must be in 0..600000"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.readmit_after_ms: 3600001 is out of range; it must be in "
                           "0..3600000"));
  EXPECT_THAT(m, HasSubstr("tiers.hbm.device: -1 is out of range"));
  EXPECT_THAT(m, HasSubstr("tiers.host.numa: -2 is not a NUMA node"));
  EXPECT_THAT(m, HasSubstr("tiers.nvme.read_gbps: -1 is not a bandwidth"));
  EXPECT_THAT(m, HasSubstr("tiers.hbm.link_gbps: inf is not a bandwidth"));
  EXPECT_THAT(m, HasSubstr("policies.write_selective_hits: must be at least 1"));
  EXPECT_THAT(m, HasSubstr("policies.prefetch.layer_window: must be at least 1"));
  EXPECT_THAT(m, HasSubstr("policies.prefetch.deadline_ms: must be at least 1"));
  EXPECT_THAT(m, HasSubstr("policies.prefill_tokens_per_s: 0 must be a finite number"));
  EXPECT_EQ(find_config_issues(c).size(), 13u) << m;
}

TEST(Validate, MetricsListenAndBuckets) {
  Config c;
  for (const char* good : {"", "127.0.0.1:9464", "0.0.0.0:0", "[::1]:9464", "host:65535"}) {
    c.metrics.listen = good;
    EXPECT_TRUE(validate_config(c).ok()) << good << ": " << problems(c);
  }
  // The last four end in a valid port but are refused by the metrics server's own parser
  // (parse_listen_address), so they must fail validation too rather than only log at open.
  for (const char* bad : {"9464", ":9464", "host:", "host:65536", "host:12x", "host:123456",
                          "::1:9464", "[::1:9464", "[]:9464", "127.0.0.1:1,127.0.0.1:2"}) {
    c.metrics.listen = bad;
    EXPECT_THAT(problems(c), HasSubstr("metrics.listen: ")) << bad;
  }
  c.metrics.listen = "::1:9464";
  EXPECT_THAT(problems(c), HasSubstr("an IPv6 host must be in brackets"));
  c.metrics.listen.clear();
  c.metrics.latency_buckets = {};
  EXPECT_THAT(problems(c), HasSubstr("metrics.latency_buckets: must list 1..64"));
  c.metrics.latency_buckets = {0.1, 0.05};
  EXPECT_THAT(problems(c), HasSubstr("entry 1 (0.05) is not above the one before (0.1)"));
  c.metrics.latency_buckets = {0.0, 1.0};
  EXPECT_THAT(problems(c), HasSubstr("entry 0 (0) must be a finite number > 0"));
}

TEST(Sizing, FramesAndExtentsFollowTheLayout) {
  Config c;  // 64 KiB pages, 32 layers
  const TierSizing s = size_tiers(c);
  EXPECT_EQ(s.page_bytes, 65536u);
  EXPECT_EQ(s.block_bytes, 2u << 20);
  EXPECT_EQ(s.frame_bytes, 65536u);
  EXPECT_EQ(s.hbm_frames, 16384u);
  EXPECT_EQ(s.host_frames, 65536u);
  EXPECT_EQ(s.nvme_header_bytes, 4096u);
  EXPECT_EQ(s.nvme_page_stride, 65536u);
  EXPECT_EQ(s.nvme_extent_bytes, (2u << 20) + 4096);
  ASSERT_EQ(s.nvme_extents_per_file.size(), 1u);
  EXPECT_EQ(s.nvme_extents_per_file[0], (16ull << 30) / ((2u << 20) + 4096));

  c.model.geometry.page_tokens = 1;  // 4 KiB pages
  c.model.geometry.head_dim = 8;     // 256-byte pages: frames round up to 4 KiB, NVMe pages to 512
  EXPECT_EQ(size_tiers(c).frame_bytes, 4096u);
  EXPECT_EQ(size_tiers(c).nvme_page_stride, 512u);
  c.model.geometry.layers = 1000;  // header: 64 + 8 x 1000 + 8 bytes -> 8 KiB
  EXPECT_EQ(size_tiers(c).nvme_header_bytes, 8192u);
  EXPECT_EQ(size_tiers(c).nvme_extent_bytes, 8192u + 1000 * 512);

  c.tiers.nvme.enabled = false;
  EXPECT_TRUE(size_tiers(c).nvme_extents_per_file.empty());
}

}  // namespace
}  // namespace kvtier
