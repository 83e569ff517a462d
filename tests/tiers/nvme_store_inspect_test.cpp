// inspect_store_files and describe_store_files: what each path of a store holds, read without
// writing anything, and what opening the store does with it, checked against what opening the
// store then does.
#include "tiers/nvme_store_inspect.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using Holds = StoreFileReport::Holds;

class InspectTest : public FourDrivesTest {
 protected:
  std::vector<StoreFileReport> inspect() {
    return inspect_store_files(*faults_, four_drives().config.paths);
  }
  // The lines of describe_store_files, one per file.
  std::vector<std::string> lines(const std::vector<StoreFileReport>& reports) {
    std::vector<std::string> out;
    std::istringstream in(describe_store_files(reports, PageFormat::as_computed(kGeom),
                                               four_drives().config.direct_io));
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  void overwrite_start(const std::string& name, char byte) {
    std::fstream f(dir_.file(name), std::ios::in | std::ios::out | std::ios::binary);
    const std::string bytes(kSuperblockBytes, byte);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // Flips a byte within the superblock's fields: its magic stays, its checksum fails.
  void damage_superblock(const std::string& name) {
    std::fstream f(dir_.file(name), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64);
    char byte = 0;
    f.get(byte);
    f.seekp(64);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  uint64_t replaced() const { return store_->stats().files_replaced.load(); }
};

TEST_F(InspectTest, BeforeAStoreIsMadeEveryFileIsMissingAndNothingIsCreated) {
  const std::vector<StoreFileReport> r = inspect();
  ASSERT_EQ(r.size(), 4u);
  for (const StoreFileReport& f : r) EXPECT_EQ(f.holds, Holds::kMissing) << f.path;
  const std::vector<std::string> l = lines(r);
  ASSERT_EQ(l.size(), 4u);
  EXPECT_THAT(l[0], HasSubstr("d0.kvs: missing; created when the store is made"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("d0.kvs")));
}

// A store of four: d1 emptied, d2 deleted where a drive is mounted, d3 overwritten with other
// bytes. The report says d0 is used, d1 and d2 formatted and created, and that d3 keeps the store
// from opening; opening it does just that. With d3's bytes zeroed, the report says it is formatted
// too, and the store opens with three files replaced, having written nothing before.
TEST_F(InspectTest, EachFileIsDescribedAsOpeningTheStoreThenTreatsIt) {
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  store_.reset();
  std::filesystem::resize_file(dir_.file("d1.kvs"), 0);
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d2.kvs")));
  overwrite_start("d3.kvs", 'x');
  faults_->treat_as_mount_point(dir_.path());
  const uint64_t writes = faults_->requests(IoOpcode::kWrite);

  std::vector<StoreFileReport> r = inspect();
  EXPECT_EQ(r[0].holds, Holds::kStoreFile);
  ASSERT_TRUE(r[0].superblock);
  EXPECT_EQ(r[0].superblock->file_index, 0u);
  EXPECT_EQ(r[1].holds, Holds::kBlank);
  EXPECT_EQ(r[2].holds, Holds::kMissing);
  EXPECT_TRUE(r[2].detail.ok()) << "its directory is a mount point: " << r[2].detail.to_string();
  EXPECT_EQ(r[3].holds, Holds::kOther);
  std::vector<std::string> l = lines(r);
  EXPECT_THAT(l[0], HasSubstr("file 0 of 4 of store"));
  EXPECT_THAT(l[0], HasSubstr("32 extents; used"));
  // Configured for another geometry, the same file would refuse the open.
  Geometry other = kGeom;
  other.layers += 1;
  EXPECT_THAT(
      describe_store_files(r, PageFormat::as_computed(other), four_drives().config.direct_io),
      HasSubstr("32 extents; the store does not open: holds a kvtier store for geometry"));
  EXPECT_THAT(l[1], HasSubstr("blank file; formatted as file 1 of store"));
  EXPECT_THAT(l[2], HasSubstr("created and formatted as file 2"));
  EXPECT_THAT(l[3], HasSubstr("holds something else (no kvtier superblock); the store does not "
                              "open"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("d2.kvs"))) << "inspecting created a file";
  EXPECT_EQ(std::filesystem::file_size(dir_.file("d1.kvs")), 0u);
  EXPECT_EQ(faults_->requests(IoOpcode::kWrite), writes);

  EXPECT_FALSE(NvmeStore::create(kGeom, four_drives()).ok());
  overwrite_start("d3.kvs", 0);
  r = inspect();
  EXPECT_EQ(r[3].holds, Holds::kBlank);
  EXPECT_THAT(lines(r)[3], HasSubstr("blank file; formatted as file 3"));
  store_ = open_with(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->stats().files_replaced.load(), 3u);
  EXPECT_EQ(store_->capacity_blocks(), 128u);
}

// Missing where no drive is mounted, or unreadable (a dead drive): the store opens without it.
TEST_F(InspectTest, AFileTheStoreOpensWithoutIsSaidSo) {
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  store_.reset();
  ASSERT_TRUE(std::filesystem::remove(dir_.file("d2.kvs")));
  faults_->fail_file("d3.kvs", EIO);
  const std::vector<StoreFileReport> r = inspect();
  EXPECT_EQ(r[2].holds, Holds::kMissing);
  EXPECT_FALSE(r[2].detail.ok()) << "its directory is not a mount point";
  EXPECT_EQ(r[3].holds, Holds::kUnreadable);
  const std::vector<std::string> l = lines(r);
  EXPECT_THAT(l[2], HasSubstr("missing; the store opens without it, out of service: not created"));
  EXPECT_THAT(l[2], HasSubstr("is not a mount point"));
  EXPECT_THAT(l[3], HasSubstr("unreadable ("));
  EXPECT_THAT(l[3], HasSubstr("the store opens without it"));
  store_ = open_with(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(out(), 2u);
}

// Cases where the open once decided otherwise than its dry run said, or was never tested: a
// path that cannot be opened (EACCES) is left out of an existing store as an unreadable one is,
// and so is a file whose superblock is damaged (never formatted over; a store of that file alone
// refuses); a blank device too small for an extent is left out, not formatted; a store file cut
// short refuses the open. The report and the open agree on each.
TEST_F(InspectTest, WhatCannotBeOpenedTooSmallTruncatedOrDamagedIsSaidAndDone) {
  reopen(four_drives());
  ASSERT_NE(store_, nullptr);
  store_.reset();
  const std::string d0 = dir_.file("d0.kvs");
  const auto full_size = std::filesystem::file_size(d0);

  faults_->fail_open("d2.kvs", EACCES);
  std::vector<StoreFileReport> r = inspect();
  EXPECT_EQ(r[2].holds, Holds::kUnreadable);
  EXPECT_THAT(lines(r)[2], HasSubstr("errno 13"));
  EXPECT_THAT(lines(r)[2], HasSubstr("the store opens without it"));
  faults_->fail_open("d2.kvs", EACCES);
  store_ = open_with(four_drives());
  ASSERT_NE(store_, nullptr) << "one path of four that cannot be opened refused the open";
  EXPECT_EQ(out(), 1u);
  store_.reset();

  faults_->treat_as_block_device("d3.kvs");
  std::filesystem::resize_file(dir_.file("d3.kvs"), 0);
  std::filesystem::resize_file(dir_.file("d3.kvs"), 2 * kSuperblockBytes);  // zeros
  r = inspect();
  EXPECT_EQ(r[3].holds, Holds::kBlank);
  EXPECT_THAT(lines(r)[3], HasSubstr("blank device; the store opens without it, out of service: "
                                     "not formatted in place of the file it lost"));
  EXPECT_THAT(lines(r)[3], HasSubstr("cannot hold one extent"));
  store_ = open_with(four_drives());
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(out(), 1u);
  EXPECT_EQ(replaced(), 0u);
  store_.reset();

  std::filesystem::resize_file(d0, full_size / 2);
  r = inspect();
  EXPECT_EQ(r[0].holds, Holds::kStoreFile);
  EXPECT_THAT(lines(r)[0], HasSubstr("the store does not open: is truncated"));
  auto truncated = NvmeStore::create(kGeom, four_drives());
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr("tiers.nvme.paths[0]"));
  EXPECT_THAT(truncated.status().message(), HasSubstr("is truncated"));

  std::filesystem::resize_file(d0, full_size);
  damage_superblock("d0.kvs");
  r = inspect();
  EXPECT_EQ(r[0].holds, Holds::kDamaged);
  EXPECT_THAT(lines(r)[0], HasSubstr("a damaged kvtier superblock ("));
  EXPECT_THAT(lines(r)[0], HasSubstr("fails its checksum"));
  EXPECT_THAT(lines(r)[0], HasSubstr("the store opens without it, out of service"));
  store_ = open_with(four_drives());
  ASSERT_NE(store_, nullptr) << "one damaged superblock of four refused the open";
  EXPECT_EQ(out(), 2u) << "d0 and d3 (the small device)";
  EXPECT_EQ(replaced(), 0u) << "a damaged superblock is never formatted over";
  store_.reset();

  // A store of one file whose superblock is damaged has no other to open with: refused.
  NvmeStoreOptions one = options();
  one.config.paths = {d0};
  auto alone = NvmeStore::create(kGeom, one);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(alone.status().message(), HasSubstr("d0.kvs"));
  EXPECT_THAT(alone.status().message(), HasSubstr("fails its checksum"));
}

// Mixes of what four files may hold, drawn at random (untouched, emptied, deleted, zeroed where
// the superblock goes, overwritten with other bytes, cut to half its size, its superblock
// damaged; one of them a block device or none, one a dead drive or none; the directory a mount
// point or not): the
// report is checked against what opening the store then does. It opens exactly when no line says
// it does not, formats or creates in place of lost files exactly those said to be, and opens
// without exactly those said to be left out. Both follow one plan (plan_store_open), so this
// checks that the open carries it out, and that the report reads it right.
TEST_F(InspectTest, WhatTheReportSaysOfRandomMixesIsWhatOpeningDoes) {
  std::mt19937 rng(20261207);
  const std::vector<std::string> names = {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs"};
  int opened = 0;
  int refused = 0;
  for (int round = 0; round < 100; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    store_.reset();
    for (const std::string& name : names) std::filesystem::remove(dir_.file(name));
    faults_ = std::make_shared<FaultInjectingIoBackend>();  // no mount point from before
    reopen(four_drives());                                  // a new store of four
    ASSERT_NE(store_, nullptr);
    store_.reset();
    // At most one block device, whose file keeps its size (a device is never empty or missing).
    const uint32_t device = rng() % 6;
    if (device < names.size()) faults_->treat_as_block_device(names[device]);
    std::string mix = device < names.size() ? "d" + std::to_string(device) + " a device, " : "";
    for (uint32_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      const uint32_t drawn = rng() % 7;
      const uint32_t state = i == device && (drawn == 1 || drawn == 2) ? 0 : drawn;
      mix += std::to_string(state);
      if (state == 1) std::filesystem::resize_file(dir_.file(name), 0);
      if (state == 2) std::filesystem::remove(dir_.file(name));
      if (state == 3) overwrite_start(name, '\0');
      if (state == 4) overwrite_start(name, 'x');
      if (state == 5) {
        std::filesystem::resize_file(dir_.file(name),
                                     std::filesystem::file_size(dir_.file(name)) / 2);
      }
      if (state == 6) damage_superblock(name);
    }
    // At most one file whose every request fails (a dead drive): unreadable. Only one with bytes
    // to read: of a deleted or empty one a dry run reads nothing, and cannot know that
    // formatting it will fail (the store then opens without it).
    const uint32_t dead = rng() % 6;
    if (dead < names.size() && std::filesystem::exists(dir_.file(names[dead])) &&
        std::filesystem::file_size(dir_.file(names[dead])) > 0) {
      faults_->fail_file(names[dead]);
      mix += ", d" + std::to_string(dead) + " dead";
    }
    const bool mount_point = rng() % 2 == 0;
    if (mount_point) faults_->treat_as_mount_point(dir_.path());
    SCOPED_TRACE("states " + mix + (mount_point ? ", a mount point" : ""));

    const std::vector<std::string> said = lines(inspect());
    ASSERT_EQ(said.size(), names.size());
    bool refuses = false;
    uint64_t replaces = 0;
    uint64_t without = 0;
    for (const std::string& line : said) {
      refuses = refuses || line.find("the store does not open") != std::string::npos;
      replaces += line.find("formatted as file") != std::string::npos ||
                  line.find("created and formatted as file") != std::string::npos;
      without += line.find("the store opens without it") != std::string::npos;
    }
    auto s = NvmeStore::create(kGeom, four_drives());
    const std::string report = ::testing::PrintToString(said);
    ASSERT_EQ(s.ok(), !refuses) << report << (s.ok() ? "" : s.status().to_string());
    if (!s.ok()) {
      ++refused;
      continue;
    }
    ++opened;
    EXPECT_EQ((*s)->stats().files_replaced.load(), replaces) << report;
    EXPECT_EQ((*s)->stats().files_out_of_service.load(), without) << report;
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace kvtier
