// A blank file or drive in place of a store's lost one is formatted as that file of the store,
// empty, and used: at open (the drive was replaced while the server was down), or by the probe of
// a file out of service (replaced while the store runs). Blank means empty, or zeros where the
// superblock goes; a missing file is created only where a drive is mounted (its directory is a
// mount point); a file that holds something else is never formatted over.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"

namespace kvtier {
namespace {

class ReplaceTest : public FourDrivesTest {
 protected:
  // Writes blocks [from, to) and returns those that landed on `name`.
  std::vector<uint64_t> write_blocks(uint64_t from, uint64_t to, const std::string& name) {
    std::vector<uint64_t> on;
    for (uint64_t id = from; id < to; ++id) {
      EXPECT_TRUE(write(id, id).ok()) << id;
      if (lies_on(id, name)) on.push_back(id);
    }
    return on;
  }
  // Overwrites the first 4 KiB of `name` with `byte` (0: as a discarded drive reads).
  void overwrite_start(const std::string& name, char byte) {
    std::fstream f(dir_.file(name), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.is_open());
    const std::string bytes(kSuperblockBytes, byte);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good());
  }
  // A store of four drives with blocks [0, blocks) written, closed; returns those on `name`.
  std::vector<uint64_t> written_and_closed(uint64_t blocks, const std::string& name) {
    reopen(four_drives());
    if (store_ == nullptr) {
      ADD_FAILURE() << "the store of four drives did not open";
      return {};
    }
    std::vector<uint64_t> on = write_blocks(0, blocks, name);
    store_.reset();
    return on;
  }
  uint64_t replaced() const { return store_->stats().files_replaced.load(); }
  // Every block of `ids` is in the store and reads back its own bytes.
  void expect_readable(const std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) {
      EXPECT_TRUE(store_->contains(test_key(id))) << id;
      EXPECT_TRUE(read(id, id).ok()) << id;
    }
  }
};

// The descriptors this process holds open.
std::ptrdiff_t open_fd_count() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                       std::filesystem::directory_iterator{});
}

std::vector<uint64_t> ids(uint64_t from, uint64_t to) {
  std::vector<uint64_t> v;
  for (uint64_t id = from; id < to; ++id) v.push_back(id);
  return v;
}

// The server was down while d2's drive was replaced, and its file was created anew (empty). The
// store opens with all four drives in service: d2 formatted, unread, empty; the others' blocks
// all there. New blocks land on d2, and after a restart d2 is a member like the others.
TEST_F(ReplaceTest, AnEmptyFileInPlaceOfALostOneIsFormattedAtOpenAndFilled) {
  const NvmeStoreOptions o = four_drives();
  const std::vector<uint64_t> on_d2 = written_and_closed(72, "d2.kvs");
  ASSERT_EQ(on_d2.size(), 8u);
  std::filesystem::resize_file(dir_.file("d2.kvs"), 0);
  const uint64_t reads_before = faults_->requests(IoOpcode::kRead);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  EXPECT_EQ(faults_->requests(IoOpcode::kRead), reads_before + 96) << "d2's headers were read";
  EXPECT_EQ(store_->keys().size(), 64u);
  for (uint64_t id : on_d2) EXPECT_FALSE(store_->contains(test_key(id))) << id;
  expect_readable(ids(0, 64));
  const std::vector<uint64_t> new_on_d2 = write_blocks(200, 264, "d2.kvs");
  EXPECT_EQ(new_on_d2.size(), 32u) << "d2's extents are all free";
  expect_readable(ids(200, 264));
  reopen(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 0u);
  EXPECT_EQ(store_->keys().size(), 128u);
  expect_readable(new_on_d2);
}

// Zeros where the superblock goes (a discarded drive, a file preallocated by hand) are blank too;
// any other bytes there are something else, and the store refuses to open over them.
TEST_F(ReplaceTest, ZerosAreFormattedOverButOtherBytesAreRefused) {
  const NvmeStoreOptions o = four_drives();
  ASSERT_NO_FATAL_FAILURE(written_and_closed(72, "d3.kvs"));
  overwrite_start("d3.kvs", 0);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  expect_readable(ids(0, 72));
  store_.reset();
  overwrite_start("d3.kvs", 'x');
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("d3.kvs"), std::string::npos) << s.status().to_string();
  EXPECT_NE(s.status().message().find("refusing to overwrite"), std::string::npos)
      << s.status().to_string();
}

// A missing file is created where a drive is mounted: its directory is a mount point, so the
// drive's file system is there, not the one beneath
// (AStoreOpensWithoutAMissingFileAndNeverCreatesIt is the other side).
TEST_F(ReplaceTest, AMissingFileIsCreatedAndFormattedWhereADriveIsMounted) {
  const NvmeStoreOptions o = four_drives();
  ASSERT_NO_FATAL_FAILURE(written_and_closed(40, "d3.kvs"));
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d3.kvs")));
  faults_->treat_as_mount_point(dir_.path());
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir_.file("d3.kvs")));
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  expect_readable(ids(0, 40));
}

// Two paths naming one missing file (through a symlinked directory) would both create it and
// format it as two files of the store: the second is refused, naming both, before it is
// formatted.
TEST_F(ReplaceTest, TwoPathsNamingOneMissingFileAreRefused) {
  NvmeStoreOptions o = four_drives();
  spread_over(o, {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs", "d4.kvs"}, 32);
  reopen(o);
  ASSERT_NE(store_, nullptr);
  store_.reset();
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d3.kvs")));
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d4.kvs")));
  std::filesystem::create_directory_symlink(dir_.path(), dir_.file("alias"));
  o.config.paths[4] = dir_.file("alias") + "/d3.kvs";
  faults_->treat_as_mount_point(dir_.path());
  faults_->treat_as_mount_point(dir_.file("alias"));
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("are the same file"), std::string::npos)
      << s.status().to_string();
}

// d2 dies, and its file is deleted (its drive's file system unmounted, say) where no drive is
// mounted now. The store still holds the old file open and could read this store's superblock
// there, but readmitting it would write blocks into a deleted file: it stays out, and nothing is
// created at the path.
TEST_F(ReplaceTest, AFileDeletedWhileOutIsNotReadmittedThroughItsOldDescriptor) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d2.kvs")));
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 2; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(readmitted(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir_.file("d2.kvs")));
}

// Formatting at open fails (no room to allocate the file): the store opens without it, out of
// service. Its probe finds it still blank, formats it, and it is back in service.
TEST_F(ReplaceTest, AFileThatCouldNotBeFormattedAtOpenIsFormattedByItsProbe) {
  const NvmeStoreOptions o = four_drives();
  ASSERT_NO_FATAL_FAILURE(written_and_closed(40, "d3.kvs"));
  std::filesystem::resize_file(dir_.file("d3.kvs"), 0);
  faults_->fail_allocate(ENOSPC);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 0u);
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  EXPECT_EQ(std::filesystem::file_size(dir_.file("d3.kvs")),
            store_->layout().extent_bytes * 32 + kSuperblockBytes);
  expect_readable(ids(0, 40));
}

// d2's drive dies and is taken out; while the store runs it is replaced: a new file system is
// mounted where the old one was, with a new, empty file at the same path (the store still holds
// the old one open). The next probe opens the path afresh, finds the new file blank, formats it,
// and readmits it with every extent: the old drive's bad-sector marks are forgotten. Blocks
// written to it then survive a restart.
TEST_F(ReplaceTest, ADriveReplacedWhileTheStoreRunsIsFormattedByItsProbe) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->take_lost_blocks().size(), 8u);
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d2.kvs")));
  { std::ofstream created(dir_.file("d2.kvs")); }
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->retired_blocks(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  std::vector<uint64_t> on_d2 = write_blocks(600, 650, "d2.kvs");
  EXPECT_FALSE(on_d2.empty());
  expect_readable(ids(600, 650));
  const std::size_t kept = store_->keys().size();
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 0u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->keys().size(), kept);
  expect_readable(on_d2);
}

// d2 is a block device whose drive dies, is taken out, and is replaced under the same name while
// the store runs, the new drive blank. The kernel gives a new drive the old one's device number as
// often as not (the fault backend models that: a device's identity comes from its path), so no
// identity check tells the two apart. The probe reads through the name opened afresh, finds the
// new drive blank, formats it, and the file keeps that descriptor: blocks written to it survive a
// restart. Mutation check: with the old descriptor kept (the two taken for the same file), the
// probe read the removed drive, readmitted it unformatted, and its blocks were lost at restart.
TEST_F(ReplaceTest, ABlockDeviceReplacedUnderTheSameNumberIsReadThroughItsNameAfresh) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  faults_->treat_as_block_device("d2.kvs");
  const auto size = std::filesystem::file_size(dir_.file("d2.kvs"));
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d2.kvs")));
  { std::ofstream created(dir_.file("d2.kvs")); }
  std::filesystem::resize_file(dir_.file("d2.kvs"), size);  // a blank drive of the same size
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(replaced(), 1u) << "the new drive was formatted";
  EXPECT_EQ(store_->capacity_blocks(), 128u);
  const std::vector<uint64_t> on_d2 = write_blocks(600, 650, "d2.kvs");
  EXPECT_FALSE(on_d2.empty());
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(out(), 0u);
  expect_readable(on_d2);
}

// The descriptor a probe of a block device opens is the file's only if the probe readmits it: the
// probes of a dead one each close theirs, so a drive dead for days holds no more open than one.
TEST_F(ReplaceTest, TheProbesOfADeadBlockDeviceLeaveNoDescriptorOpen) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  faults_->treat_as_block_device("d2.kvs");
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 1; }));
  const auto after_one = open_fd_count();
  ASSERT_TRUE(writing_until(500, [&] { return probes() == 4; }));
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(open_fd_count(), after_one) << "a failed probe left its descriptor open";
}

// A flapping block device, taken out and readmitted again and again, holds one descriptor: each
// readmission gives the file the one its probe opened, and the one it replaces closes once no
// operation made with it is left (they are all done here), not when the store closes.
TEST_F(ReplaceTest, ADeviceReadmittedAgainAndAgainHoldsOneDescriptor) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  faults_->treat_as_block_device("d2.kvs");
  const auto held = open_fd_count();  // d2's own among them
  uint64_t id = 1000;
  for (uint64_t round = 1; round <= 4; ++round) {
    if (round > 1) {
      faults_->fail_file("d2.kvs");
      std::vector<uint64_t> written;  // elsewhere, erased once d2 is out: the store stays as full
      for (const uint64_t last = id + 64; id < last && out() == 0; ++id) {
        if (write(id, id).ok()) written.push_back(id);
      }
      ASSERT_EQ(out(), 1u) << "round " << round;
      for (uint64_t w : written) EXPECT_TRUE(store_->erase(test_key(w)).ok()) << w;
    }
    faults_->clear();
    ASSERT_TRUE(writing_until(500, [&] { return readmitted() == round; })) << "round " << round;
    // A probe's operation may end just after it counts.
    EXPECT_TRUE(eventually([&] { return open_fd_count() == held; }))
        << "round " << round << ": " << open_fd_count() - held << " more descriptors open";
  }
  const std::vector<uint64_t> on_d2 = write_blocks(2000, 2032, "d2.kvs");
  EXPECT_FALSE(on_d2.empty());
  expect_readable(on_d2);
}

// A block device is formatted into the store only when blank: after a replacement its name may
// name another drive, so one holding anything refuses the open, saying how to clear it. A blank
// one smaller than the lost one is formatted with the extents it holds.
TEST_F(ReplaceTest, ABlockDeviceIsFormattedInPlaceOfALostFileOnlyWhenBlank) {
  const NvmeStoreOptions o = four_drives();
  reopen(o);
  ASSERT_NE(store_, nullptr);
  write_blocks(0, 72, "d3.kvs");
  const uint64_t extent_bytes = store_->layout().extent_bytes;
  store_.reset();
  faults_->treat_as_block_device("d3.kvs");
  overwrite_start("d3.kvs", 'x');
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("d3.kvs"), std::string::npos) << s.status().to_string();
  EXPECT_NE(s.status().message().find("blkdiscard"), std::string::npos) << s.status().to_string();
  overwrite_start("d3.kvs", 0);
  std::filesystem::resize_file(dir_.file("d3.kvs"), kSuperblockBytes + 20 * extent_bytes);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 96u + 20u);
  expect_readable(ids(0, 72));
}

// While the store runs, d2's drive dies and is replaced by a blank block device smaller than the
// old one: its probe formats it with the 20 extents it holds, and the other 12 of its place stay
// retired. After a restart it is a file of 20 extents like any other.
TEST_F(ReplaceTest, ASmallerBlankDeviceIsFormattedByItsProbeWithTheExtentsItHolds) {
  take_out_d2(/*hang=*/false);
  ASSERT_NE(store_, nullptr);
  const uint64_t extent_bytes = store_->layout().extent_bytes;
  faults_->treat_as_block_device("d2.kvs");
  std::filesystem::resize_file(dir_.file("d2.kvs"), 0);
  std::filesystem::resize_file(dir_.file("d2.kvs"), kSuperblockBytes + 20 * extent_bytes);
  faults_->clear();
  ASSERT_TRUE(writing_until(500, [&] { return readmitted() == 1; }));
  EXPECT_EQ(replaced(), 1u);
  EXPECT_EQ(out(), 0u);
  EXPECT_EQ(store_->capacity_blocks(), 96u + 20u);
  EXPECT_EQ(store_->retired_blocks(), 12u);
  const std::vector<uint64_t> on_d2 = write_blocks(600, 650, "d2.kvs");
  EXPECT_EQ(on_d2.size(), 20u) << "d2 took as many blocks as it holds extents";
  expect_readable(on_d2);
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->capacity_blocks(), 96u + 20u);
  EXPECT_EQ(store_->retired_blocks(), 0u);
  expect_readable(on_d2);
}

}  // namespace
}  // namespace kvtier
