// Every injected I/O fault becomes a Status that names the file, the offset and the errno; the
// block stays a miss (never wrong data); the counters say what happened; accounting stays exact.
// A bad sector costs one failed write or read and its extent, retired until the store reopens; a
// dead drive among several is taken out of service, its blocks listed as lost.
#include "tiers/fault_injection.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_store.hpp"

namespace kvtier {
namespace {

TEST_F(FaultTest, ReadEioIsAMissThatNamesFileOffsetAndErrno) {
  ASSERT_TRUE(write(1, 1).ok());
  faults_->add_rule({IoOpcode::kRead, FaultKind::kError, 1, 1, EIO});
  Status r = read(1, 1);
  EXPECT_EQ(r.code(), StatusCode::kIoError) << r.to_string();
  EXPECT_NE(r.message().find("store0.kvs"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("offset"), std::string::npos);
  EXPECT_NE(r.message().find("errno 5"), std::string::npos);
  EXPECT_NE(r.message().find(key_text(test_key(1))), std::string::npos);
  EXPECT_EQ(faults_->injected(), 1u);
  EXPECT_EQ(store_->stats().io_errors.load(), 1u);
  EXPECT_EQ(link(Link::kNvmeToHost).errors.load(), 1u);
  // An I/O error is not proof of bad data: the block stays and the next read is served.
  EXPECT_TRUE(store_->contains(test_key(1)));
  EXPECT_TRUE(read(1, 1).ok());
  EXPECT_EQ(link(Link::kNvmeToHost).ops.load(), 1u);
}

TEST_F(FaultTest, WriteEioLeavesNoBlockAndFreesTheExtent) {
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1, EIO});
  Status w = write(1, 1);
  EXPECT_EQ(w.code(), StatusCode::kIoError) << w.to_string();
  EXPECT_NE(w.message().find("errno 5"), std::string::npos);
  EXPECT_FALSE(store_->contains(test_key(1)));
  EXPECT_EQ(store_->used_blocks(), 0u);
  EXPECT_EQ(read(1, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(link(Link::kHostToNvme).errors.load(), 1u);
  // The same key can be written again.
  EXPECT_TRUE(write(1, 1).ok());
  EXPECT_TRUE(read(1, 1).ok());
}

TEST_F(FaultTest, WriteEnospcIsResourceExhausted) {
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1, ENOSPC});
  Status w = write(1, 1);
  EXPECT_EQ(w.code(), StatusCode::kResourceExhausted) << w.to_string();
  EXPECT_NE(w.message().find("errno 28"), std::string::npos);
  EXPECT_FALSE(store_->contains(test_key(1)));
  EXPECT_EQ(store_->used_blocks(), 0u);
  // A full medium blames no sector: the extent stays in service.
  EXPECT_EQ(store_->retired_blocks(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 8u);
}

// The byte offset of the extent that the next write takes: written, located and erased (the
// allocator hands the freed extent out again first on this thread).
uint64_t next_extent_offset(NvmeStore& store, AlignedPages& pages) {
  auto t = store.write_block(test_key(999), pages.const_pages());
  EXPECT_TRUE(t.ok() && t->wait().ok());
  auto place = store.locate(test_key(999));
  EXPECT_TRUE(place.ok()) << place.status().to_string();
  EXPECT_TRUE(store.erase(test_key(999)).ok());
  return place.ok() ? place->offset : 0;
}

TEST_F(FaultTest, ABadSectorRetiresItsExtentAndLaterBlocksLandElsewhere) {
  AlignedPages pages(kGeom.layers, store_->page_io_bytes());
  pages.fill(1, kGeom.page_bytes());
  const uint64_t bad = next_extent_offset(*store_, pages);
  faults_->add_bad_range(IoOpcode::kWrite, bad, 512);
  // Fill the store and empty it, 20 times: every extent in service is taken in every round, so
  // an extent that went back to the free list would be written (and fail) in every round.
  int media_errors = 0;
  int full = 0;
  for (int round = 0; round < 20; ++round) {
    for (uint64_t id = 0; id < 8; ++id) {
      Status w = write(id, id + round);
      if (w.code() == StatusCode::kIoError) {
        ++media_errors;
        EXPECT_NE(w.message().find("offset " + std::to_string(bad)), std::string::npos)
            << w.message();
      } else if (w.code() == StatusCode::kResourceExhausted) {
        ++full;
      } else {
        ASSERT_TRUE(w.ok()) << w.to_string();
        auto place = store_->locate(test_key(id));
        ASSERT_TRUE(place.ok());
        EXPECT_NE(place->offset, bad);
      }
    }
    for (uint64_t id = 0; id < 8; ++id) {
      if (store_->contains(test_key(id))) {
        EXPECT_TRUE(read(id, id + round).ok());
        ASSERT_TRUE(store_->erase(test_key(id)).ok());
      }
    }
  }
  EXPECT_EQ(media_errors, 1);
  EXPECT_EQ(full, 19);  // 7 extents in service: the eighth write of each later round
  EXPECT_EQ(store_->retired_blocks(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 7u);
  // Reopened, the store gives the extent another chance (a drive remaps a sector on write).
  store_.reset();
  faults_->clear();
  store_ = open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->retired_blocks(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 8u);
}

TEST_F(FaultTest, AReadMediaErrorRetiresTheExtentOnceItsBlockIsErased) {
  ASSERT_TRUE(write(1, 1).ok());
  auto place = store_->locate(test_key(1));
  ASSERT_TRUE(place.ok());
  faults_->add_bad_range(IoOpcode::kRead, place->offset, 512);
  EXPECT_EQ(read(1, 1).code(), StatusCode::kIoError);
  // Still readable as far as the store knows (an I/O error is not proof of bad data) ...
  EXPECT_TRUE(store_->contains(test_key(1)));
  EXPECT_EQ(store_->retired_blocks(), 0u);
  // ... but its extent does not come back once the block goes.
  ASSERT_TRUE(store_->erase(test_key(1)).ok());
  EXPECT_EQ(store_->retired_blocks(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 7u);
  for (uint64_t id = 10; id < 17; ++id) {
    ASSERT_TRUE(write(id, id).ok());
    EXPECT_NE(store_->locate(test_key(id))->offset, place->offset);
  }
  EXPECT_EQ(write(17, 17).code(), StatusCode::kResourceExhausted);
}

TEST_F(FaultTest, ADeviceFailingEveryWriteRetiresNoMoreThanOneExtentIn32) {
  store_.reset();
  NvmeStoreOptions o = options();
  o.config.paths = {dir_.file("large.kvs")};
  o.config.capacity_bytes = 96 * (kGeom.block_bytes() + 4096);
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  store_ = std::move(s).value();
  ASSERT_EQ(store_->capacity_blocks(), 96u);
  EXPECT_EQ(store_->max_retired_blocks(), 3u);
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1000, EIO});
  for (uint64_t id = 0; id < 40; ++id) EXPECT_EQ(write(id, id).code(), StatusCode::kIoError);
  EXPECT_EQ(store_->retired_blocks(), 3u);
  EXPECT_EQ(store_->capacity_blocks(), 93u);
  EXPECT_EQ(store_->used_blocks(), 0u);
  EXPECT_EQ(store_->stats().files_out_of_service.load(), 0u) << "the only file stays in service";
}

// A dead drive among four: every request to the third file fails. The writes that land there
// fail, NvmeFileHealth::kDefaultFailuresInARow of them in a row, and the file is out of service
// (the last failure says kUnavailable: from then on a request to the file says nothing of the
// others). Its free extents are retired, its blocks dropped and listed once for take_lost_blocks(),
// and every later write lands on the other three and succeeds. Without this, all 30 of 30 writes
// failed: past the retirement cap a failed extent went back to the free list and came round
// again. Reopened with the drive working, the store uses all four again.
TEST_F(FaultTest, ADeadDriveAmongSeveralIsTakenOutOfServiceAndItsBlocksListedAsLost) {
  store_.reset();
  NvmeStoreOptions o = options();
  spread_over(o, {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs"}, 32);
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  store_ = std::move(s).value();
  ASSERT_EQ(store_->capacity_blocks(), 128u);
  const auto on_dead_drive = [&](uint64_t id) { return lies_on(id, "d2.kvs"); };
  // Extents are handed out in order at first: 72 blocks fill the first two files and 8 of the
  // third.
  std::vector<BlockKey> expected_lost;
  for (uint64_t id = 0; id < 72; ++id) {
    ASSERT_TRUE(write(id, id).ok());
    if (on_dead_drive(id)) expected_lost.push_back(test_key(id));
  }
  ASSERT_FALSE(expected_lost.empty());
  faults_->fail_file("d2.kvs");
  int io_errors = 0;
  int unavailable = 0;
  for (uint64_t id = 100; id < 130; ++id) {
    const Status w = write(id, id);
    if (w.code() == StatusCode::kIoError) {
      ++io_errors;
    } else if (w.code() == StatusCode::kUnavailable) {
      // The failure that took the drive out says so, for the scheduler not to count it.
      EXPECT_NE(w.message().find("d2.kvs is out of service"), std::string::npos) << w.message();
      ++unavailable;
    } else {
      ASSERT_TRUE(w.ok()) << w.to_string();
      EXPECT_FALSE(on_dead_drive(id)) << "a write succeeded on the dead drive";
    }
  }
  EXPECT_EQ(io_errors, static_cast<int>(NvmeFileHealth::kDefaultFailuresInARow) - 1);
  EXPECT_EQ(unavailable, 1);
  EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
  EXPECT_EQ(store_->retired_blocks(), 32u) << "every extent of the dead drive, and no other";
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  std::vector<BlockKey> lost = store_->take_lost_blocks();
  std::sort(lost.begin(), lost.end());
  std::sort(expected_lost.begin(), expected_lost.end());
  EXPECT_EQ(lost, expected_lost);
  EXPECT_TRUE(store_->take_lost_blocks().empty()) << "listed once";
  for (const BlockKey& key : expected_lost) EXPECT_FALSE(store_->contains(key));
  for (uint64_t id = 0; id < 72; ++id) {
    if (store_->contains(test_key(id))) {
      EXPECT_TRUE(read(id, id).ok());
    }
  }
  // Reopened with the drive working, all four files are in service again.
  store_.reset();
  faults_->clear();
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  EXPECT_EQ(store_->stats().files_out_of_service.load(), 0u);
}

// tiers.nvme.out_of_service_after_failures sets how many failures in a row take a drive out: 3
// here, so 2 writes fail with kIoError and the third takes it out; with 0 it is never taken out,
// and every write that lands on it fails.
TEST_F(FaultTest, TheFailuresThatTakeADriveOutAreConfigured) {
  for (const uint32_t after : {3u, 0u}) {
    SCOPED_TRACE(after);
    store_.reset();
    faults_->clear();
    NvmeStoreOptions o = options();
    const std::string run = std::to_string(after);
    // Extents are handed out in order at first: the writes land on the dead drive.
    spread_over(
        o, {"dead" + run + ".kvs", "a" + run + ".kvs", "b" + run + ".kvs", "c" + run + ".kvs"}, 32);
    o.config.out_of_service_after_failures = after;
    store_ = open_with(o);
    ASSERT_NE(store_, nullptr);
    faults_->fail_file("dead" + run);
    int io_errors = 0;
    int unavailable = 0;
    for (uint64_t id = 0; id < 30; ++id) {
      const Status w = write(id, id);
      io_errors += w.code() == StatusCode::kIoError;
      unavailable += w.code() == StatusCode::kUnavailable;
    }
    if (after == 0) {
      EXPECT_EQ(unavailable, 0);
      EXPECT_EQ(io_errors, 30) << "every write lands on the dead drive, and fails";
      EXPECT_EQ(store_->stats().files_out_of_service.load(), 0u);
    } else {
      EXPECT_EQ(io_errors, 2);
      EXPECT_EQ(unavailable, 1);
      EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
    }
  }
}

TEST_F(FaultTest, TheKthReadFailsAndOnlyIt) {
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(write(id, id).ok());
  faults_->add_rule({IoOpcode::kRead, FaultKind::kError, 3, 1, EIO});
  int failed = 0;
  for (uint64_t id = 0; id < 4; ++id) {
    Status r = read(id, id);
    if (!r.ok()) {
      ++failed;
      EXPECT_EQ(id, 2u);  // one request per block read here: the third read is the third request
    }
  }
  EXPECT_EQ(failed, 1);
}

TEST_F(FaultTest, ShortReadsAreRequeuedAndComplete) {
  ASSERT_TRUE(write(1, 1).ok());
  faults_->add_rule({IoOpcode::kRead, FaultKind::kShort, 1, 3});
  EXPECT_TRUE(read(1, 1).ok());
  EXPECT_GE(store_->stats().io_requeued.load(), 1u);
  EXPECT_EQ(faults_->injected(), 3u);
}

TEST_F(FaultTest, ShortWritesAreRequeuedAndComplete) {
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kShort, 1, 2});
  ASSERT_TRUE(write(1, 1).ok());
  EXPECT_GE(store_->stats().io_requeued.load(), 1u);
  EXPECT_TRUE(read(1, 1).ok());
}

TEST_F(FaultTest, EagainIsRequeued) {
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kAgain, 1, 2});
  faults_->add_rule({IoOpcode::kRead, FaultKind::kAgain, 1, 2});
  ASSERT_TRUE(write(1, 1).ok());
  EXPECT_TRUE(read(1, 1).ok());
  EXPECT_EQ(store_->stats().io_requeued.load(), 4u);
  EXPECT_EQ(store_->stats().io_errors.load(), 0u);
}

TEST_F(FaultTest, ByteFlippedOnDiskDuringWriteIsCaughtOnRead) {
  faults_->add_rule(
      {IoOpcode::kWrite, FaultKind::kCorrupt, 1, 1, 0, store_->layout().header_bytes + 100});
  ASSERT_TRUE(write(1, 1).ok());  // the device said yes; the bytes are wrong
  Status r = read(1, 1);
  EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r.to_string();
  EXPECT_FALSE(store_->contains(test_key(1)));
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(link(Link::kNvmeToHost).errors.load(), 1u);
}

TEST_F(FaultTest, ByteFlippedInTransitOnReadIsCaught) {
  ASSERT_TRUE(write(1, 1).ok());
  faults_->add_rule(
      {IoOpcode::kRead, FaultKind::kCorrupt, 1, 1, 0, store_->layout().header_bytes + 5});
  EXPECT_EQ(read(1, 1).code(), StatusCode::kDataLoss);
  EXPECT_FALSE(store_->contains(test_key(1)));
}

TEST_F(FaultTest, CorruptHeaderReadIsCaught) {
  ASSERT_TRUE(write(1, 1).ok());
  faults_->add_rule({IoOpcode::kRead, FaultKind::kCorrupt, 1, 1, 0, 9});  // inside the key
  Status r = read(1, 1);
  EXPECT_EQ(r.code(), StatusCode::kDataLoss);
  EXPECT_FALSE(store_->contains(test_key(1)));
}

TEST_F(FaultTest, UnreadableHeadersAtRestartAreSkipped) {
  for (uint64_t id = 0; id < 3; ++id) ASSERT_TRUE(write(id, id).ok());
  store_.reset();
  faults_->add_rule({IoOpcode::kRead, FaultKind::kError, 1, 1, EIO});  // the first header read
  store_ = open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->keys().size(), 2u);
  for (BlockKey k : store_->keys()) EXPECT_TRUE(store_->contains(k));
}

TEST_F(FaultTest, OpenFailureNamesThePath) {
  store_.reset();
  faults_->fail_open("store0.kvs", EACCES);
  auto s = NvmeStore::create(kGeom, options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError);
  EXPECT_NE(s.status().message().find("store0.kvs"), std::string::npos);
  EXPECT_NE(s.status().message().find("errno 13"), std::string::npos);
}

TEST_F(FaultTest, ODirectRefusedFallsBackToBufferedIo) {
  store_.reset();
  std::remove(dir_.file("store0.kvs").c_str());
  faults_->fail_open("store0.kvs", EINVAL);  // what a filesystem without O_DIRECT answers
  store_ = open();
  ASSERT_NE(store_, nullptr);
  EXPECT_FALSE(store_->direct_io());
  ASSERT_TRUE(write(1, 1).ok());
  EXPECT_TRUE(read(1, 1).ok());
}

TEST_F(FaultTest, AllocationFailureOnCreateIsReported) {
  store_.reset();
  std::remove(dir_.file("store0.kvs").c_str());
  faults_->fail_allocate(ENOSPC);
  auto s = NvmeStore::create(kGeom, options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find("store0.kvs"), std::string::npos);
  EXPECT_NE(s.status().message().find("errno 28"), std::string::npos);
}

TEST_F(FaultTest, ManyFaultsUnderLoadKeepAccountingExact) {
  // Every fifth write and every seventh read fails; everything else must be exact.
  for (uint64_t n = 1; n < 200; n += 5)
    faults_->add_rule({IoOpcode::kWrite, FaultKind::kError, n, 1, EIO});
  for (uint64_t n = 1; n < 200; n += 7)
    faults_->add_rule({IoOpcode::kRead, FaultKind::kShort, n, 1});
  for (uint64_t n = 3; n < 200; n += 11)
    faults_->add_rule({IoOpcode::kRead, FaultKind::kError, n, 1, EIO});
  int ok_writes = 0;
  for (uint64_t round = 0; round < 6; ++round) {
    for (uint64_t id = 0; id < 8; ++id) {
      if (write(id, id + round).ok()) ++ok_writes;
    }
    for (uint64_t id = 0; id < 8; ++id) {
      Status r = read(id, id + round);
      EXPECT_TRUE(r.ok() || r.code() == StatusCode::kIoError || r.code() == StatusCode::kNotFound)
          << r.to_string();
      store_->erase(test_key(id)).ignore();
    }
  }
  EXPECT_GT(ok_writes, 0);
  EXPECT_GT(faults_->injected(), 0u);
  EXPECT_EQ(store_->used_blocks(), 0u);
}

}  // namespace
}  // namespace kvtier
