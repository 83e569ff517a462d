#include "runtime/config_describe.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Describe, DefaultSummaryHasGeometryTiersPoliciesAndMetrics) {
  const std::string d = describe_config(Config{});
  EXPECT_THAT(d, HasSubstr("model     llama-3.1-8b (key namespace \"llama-3.1-8b\")\n"));
  EXPECT_THAT(d, HasSubstr("32 layers, 8 kv heads x head_dim 128, bf16, 16 tokens/page\n"));
  EXPECT_THAT(d, HasSubstr("page 64 KiB (65536 B), block 2 MiB (2097152 B), KV per token 128 KiB "
                           "(131072 B)\n"));
  EXPECT_THAT(d, HasSubstr("tier hbm  backend auto, device 0, capacity 1 GiB (1073741824 B)\n"));
  EXPECT_THAT(d, HasSubstr("16384 frames of 64 KiB, watermarks low 0.85 high 0.95"));
  EXPECT_THAT(d, HasSubstr("65536 frames of 64 KiB"));
  EXPECT_THAT(d, HasSubstr("8176 extents of 2 MiB (4 KiB header + 32 x 64 KiB pages)"));
  EXPECT_THAT(d, HasSubstr("path ./.kvtier/store0.kvs (8176 extents)\n"));
  EXPECT_THAT(d, HasSubstr("writes paused 1000 ms after 8 failed in a row\n"));
  EXPECT_THAT(d, HasSubstr("reads paused 1000 ms after 8 failed in a row\n"));
  EXPECT_THAT(d, HasSubstr("a request unanswered for 5000 ms fails its drive\n"));
  EXPECT_THAT(d, HasSubstr("a file out of service after 8 failed in a row\n"));
  EXPECT_THAT(d, HasSubstr("a file out of service probed after 30000 ms\n"));
  EXPECT_THAT(d, HasSubstr("policies  eviction lru, write write_back"));
  EXPECT_THAT(d,
              HasSubstr("metrics   listen 127.0.0.1:9464, 12 latency buckets 0.0001 s .. 1 s\n"));
  // One item per line, no trailing spaces.
  EXPECT_THAT(d, Not(HasSubstr(" \n")));
}

TEST(Describe, ReflectsWhatChanged) {
  Config c;
  c.model.key_namespace = "tenant-a";
  c.tiers.nvme.enabled = false;
  c.metrics.listen.clear();
  c.policies.write = WritePolicy::kWriteThroughSelective;
  c.policies.write_selective_hits = 3;
  c.tiers.host.numa_node = 1;
  const std::string d = describe_config(c);
  Config never;
  never.tiers.nvme.pause_after_failed_writes = 0;
  never.tiers.nvme.pause_after_failed_reads = 0;
  never.tiers.nvme.io_timeout_ms = 0;
  never.tiers.nvme.out_of_service_after_failures = 0;
  never.tiers.nvme.readmit_after_ms = 0;
  EXPECT_THAT(describe_config(never), HasSubstr("writes never paused after failures\n"));
  EXPECT_THAT(describe_config(never), HasSubstr("reads never paused after failures\n"));
  EXPECT_THAT(describe_config(never), HasSubstr("requests never time out\n"));
  EXPECT_THAT(describe_config(never), HasSubstr("files never taken out of service\n"));
  EXPECT_THAT(describe_config(never),
              HasSubstr("a file out of service stays out until a restart\n"));
  EXPECT_THAT(d, HasSubstr("(key namespace \"tenant-a\")"));
  EXPECT_THAT(d, HasSubstr("tier nvme disabled\n"));
  EXPECT_THAT(d, HasSubstr("write write_through_selective after 3 hits"));
  EXPECT_THAT(d, HasSubstr("metrics   off,"));
  EXPECT_THAT(d, HasSubstr("numa 1,"));
}

TEST(Describe, SaysHowEachTierBelowHbmHoldsPages) {
  Config c;
  std::string d = describe_config(c);
  EXPECT_THAT(d, HasSubstr("pages held as bf16\n"));
  EXPECT_THAT(d, HasSubstr("pages stored as bf16\n"));
  c.tiers.host.kv_dtype = TierKvDtype::kFp8E4M3;
  c.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  d = describe_config(c);
  EXPECT_THAT(d, HasSubstr("pages held as fp8_e4m3\n"));
  EXPECT_THAT(d, HasSubstr("pages stored as fp8_e4m3\n"));
  // 4 GiB of 36 KiB frames (a 32 KiB fp8 page and its scales, 4 KiB aligned) instead of 64 KiB.
  EXPECT_THAT(d, HasSubstr("116508 frames of 36 KiB"));
}

TEST(Describe, ListsEveryNvmePath) {
  Config c;
  c.tiers.nvme.paths = {"/mnt/a.kvs", "/mnt/b.kvs"};
  const std::string d = describe_config(c);
  EXPECT_THAT(d, HasSubstr("over 2 paths"));
  EXPECT_THAT(d, HasSubstr("path /mnt/a.kvs (4088 extents)\n"));
  EXPECT_THAT(d, HasSubstr("path /mnt/b.kvs (4088 extents)\n"));
}

}  // namespace
}  // namespace kvtier
