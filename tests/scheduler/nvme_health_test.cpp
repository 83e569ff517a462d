// NvmeHealth: failures in a row pause one direction of NVMe I/O, each failed retry doubles the
// pause up to the longest, and a success starts everything again (and says when it ends an
// outage). Which failures say something of the disk, for writes and for reads.
#include "scheduler/nvme_health.hpp"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

NvmePauseOptions three_then(Nanos first, Nanos longest) {
  NvmePauseOptions o;
  o.after_failures = 3;
  o.first_pause = first;
  o.longest_pause = longest;
  return o;
}

TEST(NvmeHealth, FailuresInARowPauseAndEachFailedRetryDoublesThePause) {
  NvmeHealth h(three_then(100, 1000));
  EXPECT_FALSE(h.on_failed());
  EXPECT_FALSE(h.on_failed());
  EXPECT_TRUE(h.usable());
  EXPECT_EQ(h.on_failed(), std::optional<Nanos>(100));
  EXPECT_FALSE(h.usable());
  // I/Os in flight when the pause began fail too: they neither count nor pause again.
  EXPECT_FALSE(h.on_failed());
  EXPECT_EQ(h.failures_in_a_row(), 3u);
  const Nanos expected[] = {200, 400, 800, 1000, 1000};
  for (Nanos pause : expected) {
    h.resume();
    EXPECT_TRUE(h.usable());
    EXPECT_EQ(h.on_failed(), std::optional<Nanos>(pause)) << "the first I/O after a pause";
  }
}

TEST(NvmeHealth, ASuccessStartsTheCountAndThePauseAgain) {
  NvmeHealth h(three_then(100, 1000));
  for (int i = 0; i < 3; ++i) h.on_failed().reset();
  h.resume();
  ASSERT_EQ(h.on_failed(), std::optional<Nanos>(200));
  h.resume();
  EXPECT_TRUE(h.on_ok()) << "the first success after a pause ends the outage";
  EXPECT_EQ(h.failures_in_a_row(), 0u);
  EXPECT_FALSE(h.on_failed());
  EXPECT_FALSE(h.on_failed());
  EXPECT_FALSE(h.on_ok()) << "between failures, no outage: they are not in a row";
  EXPECT_FALSE(h.on_failed());
  EXPECT_FALSE(h.on_failed());
  EXPECT_EQ(h.on_failed(), std::optional<Nanos>(100)) << "the first pause again";
}

TEST(NvmeHealth, ZeroFailuresNeverPauses) {
  NvmePauseOptions o;
  o.after_failures = 0;
  NvmeHealth h(o);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(h.on_failed());
  EXPECT_TRUE(h.usable());
}

TEST(NvmeHealth, OptionsFromTheConfig) {
  NvmeTierConfig c;
  c.pause_after_failed_writes = 5;
  c.pause_after_failed_reads = 7;
  c.pause_ms = 250;
  NvmePauseOptions writes = nvme_write_pause_options(c);
  NvmePauseOptions reads = nvme_read_pause_options(c);
  EXPECT_EQ(writes.after_failures, 5u);
  EXPECT_EQ(reads.after_failures, 7u);
  for (const NvmePauseOptions& o : {writes, reads}) {
    EXPECT_EQ(o.first_pause, 250 * kNanosPerMilli);
    EXPECT_EQ(o.longest_pause, 300 * kNanosPerSecond);
  }
  c.pause_ms = 600'000;  // longer than the usual longest: every pause lasts that long
  EXPECT_EQ(nvme_write_pause_options(c).longest_pause, 600 * kNanosPerSecond);
  EXPECT_EQ(nvme_read_pause_options(c).longest_pause, 600 * kNanosPerSecond);
}

// A write failure is the disk's unless the block could not be encoded or the write was cancelled;
// a read failure is the disk's when the I/O failed, the bytes came back wrong or the drive left
// requests unanswered past their timeout, not when its
// block left NVMe before the read started or the read was cancelled. Neither is the disk's when
// the store took the request's drive out of service (kUnavailable).
TEST(NvmeHealth, WhichFailuresAreTheDisks) {
  EXPECT_TRUE(is_disk_write_failure(io_error("EIO")));
  EXPECT_TRUE(is_disk_write_failure(resource_exhausted("ENOSPC")));
  EXPECT_TRUE(is_disk_write_failure(deadline_exceeded("unanswered after 5000 ms")));
  EXPECT_FALSE(is_disk_write_failure(invalid_argument("NaN in an fp8 page")));
  EXPECT_FALSE(is_disk_write_failure(cancelled("shutdown")));
  EXPECT_FALSE(is_disk_write_failure(unavailable("its drive is out of service")));
  EXPECT_FALSE(is_disk_write_failure(ok_status()));
  EXPECT_TRUE(is_disk_read_failure(io_error("EIO")));
  EXPECT_TRUE(is_disk_read_failure(data_loss("checksum")));
  EXPECT_TRUE(is_disk_read_failure(deadline_exceeded("the drive has requests unanswered")));
  EXPECT_FALSE(is_disk_read_failure(unavailable("the block left NVMe")));
  EXPECT_FALSE(is_disk_read_failure(cancelled("shutdown")));
  EXPECT_FALSE(is_disk_read_failure(ok_status()));
}

}  // namespace
}  // namespace kvtier
