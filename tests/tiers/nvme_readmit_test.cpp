// A drive taken out of service comes back without a restart (tiers.nvme.readmit_after_ms): once
// its wait is over, the next write posts a probe that reads the drive's superblock. A drive that
// answers with this store's superblock is back in service, empty (its old blocks stay lost, its
// extents are handed out again); one that still fails, holds requests unanswered, or now holds
// another superblock (replaced, wiped) stays out, and each probe waits twice as long as the last.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"

namespace kvtier {
namespace {

constexpr uint32_t kReadmitAfterMs = 50;

class ReadmitTest : public FaultTest {
 protected:
  // Four drives of 32 extents; 72 blocks fill d0 and d1 and 8 extents of d2, which then dies
  // (`hang`: stops answering) and is taken out by the writes that follow. Returns the blocks it
  // held.
  std::vector<BlockKey> take_out_d2(bool hang) {
    store_.reset();
    NvmeStoreOptions o = options();
    spread_over(o, {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs"}, 32);
    o.config.readmit_after_ms = kReadmitAfterMs;
    o.config.io_timeout_ms = 200;
    store_ = open_with(o);
    std::vector<BlockKey> lost;
    if (store_ == nullptr) return lost;
    for (uint64_t id = 0; id < 72; ++id) {
      EXPECT_TRUE(write(id, id).ok());
      if (lies_on(id, "d2.kvs")) lost.push_back(test_key(id));
    }
    if (hang) {
      faults_->hang_file("d2.kvs");
    } else {
      faults_->fail_file("d2.kvs");
    }
    for (uint64_t id = 100; id < 130 && store_->stats().files_out_of_service.load() == 0; ++id) {
      write(id, id).ignore();
    }
    EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
    EXPECT_EQ(store_->capacity_blocks(), 96u + (hang ? 1u : 0u));  // hung: one extent still held
    return lost;
  }
  // Writes and erases block `id` until `done` (a probe is posted only when a write is), or 10 s.
  template <typename F>
  bool writing_until(uint64_t id, F done) {
    return eventually([&] {
      if (write(id, id).ok()) store_->erase(test_key(id)).ignore();
      return done();
    });
  }
  uint64_t probes() const { return store_->stats().nvme_probes.load(); }
  uint64_t readmitted() const { return store_->stats().files_readmitted.load(); }
  uint64_t out() const { return store_->stats().files_out_of_service.load(); }
};

TEST_F(ReadmitTest, ADeadDriveThatAnswersAgainIsBackInServiceEmpty) {
  std::vector<BlockKey> lost = take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  ASSERT_EQ(lost.size(), 8u);
  EXPECT_EQ(store_->take_lost_blocks().size(), 8u);
  EXPECT_EQ(probes(), 0u) << "no probe before the wait";
  // Still dead: the first probe fails, and so does the second (one at a time, so the first ended).
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(readmitted(), 0u);
  EXPECT_EQ(store_->retired_blocks(), 32u);
  // The drive answers again: the next probe puts it back, with every extent free but the 4 its
  // first failed writes marked bad (the one-in-32 cap), which stay retired until a restart.
  faults_->clear();
  ASSERT_TRUE(writing_until(501, [&] { return readmitted() == 1; }));
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(probes(), 3u);
  EXPECT_EQ(store_->retired_blocks(), 4u);
  EXPECT_EQ(store_->capacity_blocks(), 124u);
  // Its old blocks stay forgotten; new ones land on it (the readmitted extents are handed out
  // first) and read back.
  for (const BlockKey& key : lost) EXPECT_FALSE(store_->contains(key));
  bool landed_on_d2 = false;
  for (uint64_t id = 600; id < 640; ++id) {
    ASSERT_TRUE(write(id, id).ok()) << id;
    landed_on_d2 = landed_on_d2 || lies_on(id, "d2.kvs");
    EXPECT_TRUE(read(id, id).ok()) << id;
  }
  EXPECT_TRUE(landed_on_d2);
  EXPECT_TRUE(store_->take_lost_blocks().empty());
}

TEST_F(ReadmitTest, AReplacedOrWipedDriveStaysOut) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  // The drive answers, but its superblock is no longer this store's (a byte of it flipped: its
  // checksum fails, as a blank or foreign drive's would).
  faults_->clear();
  ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(dir_.file("d2.kvs"), 16).ok());
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(readmitted(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
}

TEST_F(ReadmitTest, AHungDriveIsProbedOnlyOnceItHasAnsweredAndThenComesBack) {
  take_out_d2(/*hang=*/true);
  ASSERT_NE(store_, nullptr);
  // While the drive holds a request, each probe is refused before it reaches the drive.
  const uint64_t reads_before = faults_->requests(IoOpcode::kRead);
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(faults_->requests(IoOpcode::kRead), reads_before) << "a probe reached the hung drive";
  faults_->answer_hung();
  ASSERT_TRUE(eventually([&] { return store_->stats().requests_unanswered.load() == 0; }));
  ASSERT_TRUE(writing_until(501, [&] { return readmitted() == 1; }));
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u) << "no request failed: no extent was marked bad";
  for (uint64_t id = 600; id < 640; ++id) ASSERT_TRUE(write(id, id).ok()) << id;
}

}  // namespace
}  // namespace kvtier
