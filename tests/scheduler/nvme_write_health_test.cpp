// NvmeWriteHealth: failures in a row pause writes to NVMe, each failed retry doubles the pause up
// to the longest, and a success starts everything again (and says when it ends an outage).
#include "scheduler/nvme_write_health.hpp"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

NvmeWritePauseOptions three_then(Nanos first, Nanos longest) {
  NvmeWritePauseOptions o;
  o.after_failed_writes = 3;
  o.first_pause = first;
  o.longest_pause = longest;
  return o;
}

TEST(NvmeWriteHealth, FailuresInARowPauseAndEachFailedRetryDoublesThePause) {
  NvmeWriteHealth h(three_then(100, 1000));
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_TRUE(h.writable());
  EXPECT_EQ(h.on_write_failed(), std::optional<Nanos>(100));
  EXPECT_FALSE(h.writable());
  EXPECT_EQ(h.pauses(), 1u);
  // Writes in flight when the pause began fail too: they neither count nor pause again.
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_EQ(h.failures_in_a_row(), 3u);
  const Nanos expected[] = {200, 400, 800, 1000, 1000};
  for (Nanos pause : expected) {
    h.resume();
    EXPECT_TRUE(h.writable());
    EXPECT_EQ(h.on_write_failed(), std::optional<Nanos>(pause)) << "the first write after a pause";
  }
  EXPECT_EQ(h.pauses(), 6u);
}

TEST(NvmeWriteHealth, ASuccessStartsTheCountAndThePauseAgain) {
  NvmeWriteHealth h(three_then(100, 1000));
  for (int i = 0; i < 3; ++i) h.on_write_failed().reset();
  h.resume();
  ASSERT_EQ(h.on_write_failed(), std::optional<Nanos>(200));
  h.resume();
  EXPECT_TRUE(h.on_write_ok()) << "the first success after a pause ends the outage";
  EXPECT_EQ(h.failures_in_a_row(), 0u);
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_FALSE(h.on_write_ok()) << "between failures, no outage: they are not in a row";
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_FALSE(h.on_write_failed());
  EXPECT_EQ(h.on_write_failed(), std::optional<Nanos>(100)) << "the first pause again";
}

TEST(NvmeWriteHealth, ZeroFailuresNeverPauses) {
  NvmeWritePauseOptions o;
  o.after_failed_writes = 0;
  NvmeWriteHealth h(o);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(h.on_write_failed());
  EXPECT_TRUE(h.writable());
  EXPECT_EQ(h.pauses(), 0u);
}

TEST(NvmeWriteHealth, OptionsFromTheConfig) {
  NvmeTierConfig c;
  c.pause_after_failed_writes = 5;
  c.pause_ms = 250;
  NvmeWritePauseOptions o = nvme_pause_options(c);
  EXPECT_EQ(o.after_failed_writes, 5u);
  EXPECT_EQ(o.first_pause, 250 * kNanosPerMilli);
  EXPECT_EQ(o.longest_pause, 300 * kNanosPerSecond);
  c.pause_ms = 600'000;  // longer than the usual longest: every pause lasts that long
  o = nvme_pause_options(c);
  EXPECT_EQ(o.longest_pause, 600 * kNanosPerSecond);
}

}  // namespace
}  // namespace kvtier
