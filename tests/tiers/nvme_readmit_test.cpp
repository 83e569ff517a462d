// A drive taken out of service comes back without a restart (tiers.nvme.readmit_after_ms): once
// its wait is over, the next write posts a probe that reads the drive's superblock and writes it
// back. A drive that answers with this store's superblock, and takes it back, is back in service,
// empty (its old blocks stay lost, its extents are handed out again); one that still fails, holds
// requests unanswered, no longer takes writes, or now holds another superblock (a foreign or
// damaged one) stays out, and each probe waits twice as long as the last. A store of several
// files opens without one that is dead or missing at start: out of service from the start, probed
// the same way, and not created where no drive is mounted. (A blank drive in place of a lost one:
// nvme_replace_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"

namespace kvtier {
namespace {

class ReadmitTest : public FourDrivesTest {};

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

TEST_F(ReadmitTest, ADriveWhoseSuperblockIsNoLongerThisStoresStaysOut) {
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

// A drive gone read-only (as an NVMe drive does on a critical warning) reads its superblock well,
// but a probe also writes it back: the write fails, and the drive stays out rather than being
// readmitted to fail every write. Once it takes writes again, the next probe readmits it.
TEST_F(ReadmitTest, ADriveThatNoLongerTakesWritesStaysOut) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  faults_->fail_file_writes("d2.kvs");
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(readmitted(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  faults_->clear();
  ASSERT_TRUE(writing_until(501, [&] { return readmitted() == 1; }));
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 124u) << "the 4 extents marked bad stay retired";
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

// 72 blocks fill d0 and d1 and 8 extents of d2; the store is reopened with d2 dead. It opens
// with the other three (64 blocks, every one read back), d2 out of service and unread; once d2
// answers, a probe readmits it, empty (its 8 blocks were never indexed), with all its extents.
TEST_F(ReadmitTest, AStoreOpensWithoutADriveDeadAtStartAndReadmitsItOnceItAnswers) {
  const NvmeStoreOptions o = four_drives();
  reopen(o);
  ASSERT_NE(store_, nullptr);
  std::vector<uint64_t> on_d2;
  for (uint64_t id = 0; id < 72; ++id) {
    ASSERT_TRUE(write(id, id).ok());
    if (lies_on(id, "d2.kvs")) on_d2.push_back(id);
  }
  ASSERT_EQ(on_d2.size(), 8u);
  store_.reset();
  faults_->fail_file("d2.kvs");
  const uint64_t reads_before = faults_->requests(IoOpcode::kRead);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(faults_->requests(IoOpcode::kRead), reads_before + 96) << "d2's headers were read";
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  EXPECT_EQ(store_->keys().size(), 64u);
  for (uint64_t id = 0; id < 72; ++id) {
    const bool lost = std::find(on_d2.begin(), on_d2.end(), id) != on_d2.end();
    EXPECT_EQ(store_->contains(test_key(id)), !lost) << id;
    if (!lost) {
      EXPECT_TRUE(read(id, id).ok()) << id;
    }
  }
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  for (uint64_t id : on_d2) EXPECT_FALSE(store_->contains(test_key(id)));
  for (uint64_t id = 600; id < 640; ++id) ASSERT_TRUE(write(id, id).ok()) << id;
}

// A file of the store deleted (or a drive whose file system did not mount): the store opens
// without it, out of service, and neither opening nor probing creates it, since its directory is
// not a mount point.
TEST_F(ReadmitTest, AStoreOpensWithoutAMissingFileAndNeverCreatesIt) {
  const NvmeStoreOptions o = four_drives();
  reopen(o);
  ASSERT_NE(store_, nullptr);
  for (uint64_t id = 0; id < 40; ++id) ASSERT_TRUE(write(id, id).ok());  // on d0 and d1
  store_.reset();
  const std::filesystem::path d3 = dir_.file("d3.kvs");
  ASSERT_TRUE(std::filesystem::remove(d3));
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  EXPECT_EQ(store_->keys().size(), 40u);
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_FALSE(std::filesystem::exists(d3)) << "a missing file of the store was created";
}

// d3 is a block device smaller than the others (10 extents where they have 32). The store
// reopened with it dead gives it the first file's 32 until its probe reads its own superblock:
// then it comes back with its 10, and the other 22 of its place stay retired.
TEST_F(ReadmitTest, AFileOpenedWithoutComesBackWithTheExtentsItsSuperblockGives) {
  const NvmeStoreOptions o = four_drives();
  store_.reset();
  const uint64_t extent_bytes = kGeom.block_bytes() + 4096;
  { std::ofstream created(dir_.file("d3.kvs")); }
  std::filesystem::resize_file(dir_.file("d3.kvs"), kSuperblockBytes + 10 * extent_bytes);
  faults_->treat_as_block_device("d3.kvs");
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  ASSERT_EQ(store_->layout().extent_bytes, extent_bytes);
  EXPECT_EQ(store_->capacity_blocks(), 96u + 10u);
  store_.reset();
  faults_->fail_file("d3.kvs");
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 96u + 10u);
  EXPECT_EQ(store_->retired_blocks(), 22u);
}

// With one file, there is nothing to open without: a dead file fails the open, naming it.
TEST_F(ReadmitTest, ALoneDeadFileStillFailsTheOpen) {
  ASSERT_TRUE(write(1, 1).ok());
  store_.reset();
  faults_->fail_file("store0.kvs");
  auto s = NvmeStore::create(kGeom, options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError) << s.status().to_string();
  EXPECT_NE(s.status().message().find("store0.kvs"), std::string::npos) << s.status().to_string();
}

}  // namespace
}  // namespace kvtier
