// The POSIX backend's O_DIRECT alignment: statx STATX_DIOALIGN where the kernel (>= 6.1) and the
// filesystem report it, else the logical block size of the file's device from sysfs (a partition
// takes its disk's), else an assumed 4096 — never 512, which fails every O_DIRECT I/O on a 4 KiB
// drive. sysfs is a fake tree in a temporary directory, laid out as the kernel lays it out
// (dev/block/M:m links to the device's directory, a partition's directory inside its disk's).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/io_backend.hpp"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  explicit FakeSysfs(const std::string& root) : root_(root) {
    fs::create_directories(root_ + "/dev/block");
  }
  const std::string& root() const { return root_; }

  // A whole disk `name` as major:minor; `lbs` is written to queue/logical_block_size unless null.
  void disk(const std::string& name, uint32_t maj, uint32_t min, const char* lbs) {
    const std::string dir = root_ + "/devices/virtual/block/" + name;
    fs::create_directories(dir);
    if (lbs != nullptr) {
      fs::create_directories(dir + "/queue");
      write(dir + "/queue/logical_block_size", lbs);
    }
    link(maj, min, "../../devices/virtual/block/" + name);
  }
  // Partition `part` of disk `disk` (no queue/ of its own, as in the kernel).
  void partition(const std::string& disk, const std::string& part, uint32_t maj, uint32_t min) {
    const std::string dir = root_ + "/devices/virtual/block/" + disk + "/" + part;
    fs::create_directories(dir);
    write(dir + "/partition", "1\n");
    link(maj, min, "../../devices/virtual/block/" + disk + "/" + part);
  }

 private:
  static void write(const std::string& path, const char* text) { std::ofstream(path) << text; }
  void link(uint32_t maj, uint32_t min, const std::string& target) {
    fs::create_directory_symlink(
        target, root_ + "/dev/block/" + std::to_string(maj) + ":" + std::to_string(min));
  }
  std::string root_;
};

class PosixIoBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  testing::TempDir dir_;
};

// A lost store file is created again only at a mount point: the root and /proc are; a directory
// made on the file system beneath is not; a missing one or a file is an error that says so.
TEST_F(PosixIoBackendTest, TellsAMountPointFromAPlainDirectory) {
  auto io = posix_io_backend();
  EXPECT_TRUE(io->is_mount_point("/").value_or(false));
  if (fs::exists("/proc/self")) {
    EXPECT_TRUE(io->is_mount_point("/proc").value_or(false));
  }
  const std::string plain = dir_.file("drive2");
  fs::create_directory(plain);
  auto p = io->is_mount_point(plain);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_FALSE(*p);
  auto missing = io->is_mount_point(dir_.file("nowhere"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nowhere"), std::string::npos);
  std::ofstream(dir_.file("a-file")) << "x";
  EXPECT_EQ(io->is_mount_point(dir_.file("a-file")).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PosixIoBackendTest, ReadsTheLogicalBlockSizeOfADiskAndOfAPartitionsDisk) {
  FakeSysfs sys(dir_.file("sys"));
  sys.disk("sda", 8, 0, "4096\n");
  sys.partition("sda", "sda1", 8, 1);
  sys.disk("vdb", 254, 16, "512\n");
  sys.partition("vdb", "vdb2", 254, 18);
  sys.disk("nvme0n1", 259, 0, "4096");  // no newline
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 8, 0), 4096u);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 8, 1), 4096u);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 254, 16), 512u);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 254, 18), 512u);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 259, 0), 4096u);
}

TEST_F(PosixIoBackendTest, MissingOrGarbledSysfsGivesNoSize) {
  FakeSysfs sys(dir_.file("sys"));
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 8, 0), 0u) << "no such device";
  EXPECT_EQ(sysfs_logical_block_size(dir_.file("nowhere"), 8, 0), 0u) << "no sysfs at all";
  sys.disk("noqueue", 7, 0, nullptr);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 7, 0), 0u) << "disk without queue/";
  sys.partition("noqueue", "noqueue1", 7, 1);
  EXPECT_EQ(sysfs_logical_block_size(sys.root(), 7, 1), 0u) << "partition of a disk without queue/";
  uint32_t minor = 10;
  for (const char* garbage : {"", "\n", "abc\n", "4096abc\n", "-512\n", "0\n", "256\n", "4097\n",
                              "1048576\n", "99999999999999999999\n", "0x1000\n"}) {
    sys.disk("bad" + std::to_string(minor), 7, minor, garbage);
    EXPECT_EQ(sysfs_logical_block_size(sys.root(), 7, minor), 0u) << "content \"" << garbage << '"';
    ++minor;
  }
}

TEST_F(PosixIoBackendTest, TheRealSysfsKnowsTheDeviceOfATempFile) {
  struct stat st = {};
  ASSERT_EQ(::stat(dir_.path().c_str(), &st), 0);
  const std::string dev =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  if (::access(dev.c_str(), F_OK) != 0) {
    GTEST_SKIP() << dir_.path() << " is not on a block device (" << dev << " does not exist)";
  }
  const uint32_t lbs = sysfs_logical_block_size("/sys", major(st.st_dev), minor(st.st_dev));
  EXPECT_GE(lbs, 512u);
  EXPECT_EQ(lbs & (lbs - 1), 0u);
}

// stat() of a regular file as on a kernel without STATX_DIOALIGN: the device's sector size from
// sysfs, or 4096 (marked as assumed) when sysfs does not know the device.
TEST_F(PosixIoBackendTest, WithoutDioalignAFileTakesItsDevicesBlockSizeOr4096) {
  const std::string file = dir_.file("store.kvs");
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ScopedFd owned(fd);
  struct stat st = {};
  ASSERT_EQ(::fstat(fd, &st), 0);

  FakeSysfs sys(dir_.file("sys"));
  sys.disk("sdz", 250, 0, "4096\n");
  sys.partition("sdz", "sdz1", major(st.st_dev), minor(st.st_dev));
  PosixIoOptions o;
  o.sysfs_root = sys.root();
  o.use_statx_dioalign = false;
  auto info = posix_io_backend(o)->stat(fd, file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_FALSE(info->block_device);
  EXPECT_EQ(info->logical_block, 4096u);
  EXPECT_TRUE(info->logical_block_known);

  FakeSysfs empty(dir_.file("empty"));
  o.sysfs_root = empty.root();
  info = posix_io_backend(o)->stat(fd, file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->logical_block, 4096u) << "512 would fail every O_DIRECT I/O on a 4 KiB drive";
  EXPECT_FALSE(info->logical_block_known);

  FakeSysfs small(dir_.file("small"));
  small.disk("sdy", major(st.st_dev), minor(st.st_dev), "512\n");
  o.sysfs_root = small.root();
  info = posix_io_backend(o)->stat(fd, file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->logical_block, 512u);
  EXPECT_TRUE(info->logical_block_known);
}

// With everything available, the real backend reports a size it knows for a file on a disk.
TEST_F(PosixIoBackendTest, TheDefaultBackendKnowsTheAlignmentOfAFileOnADisk) {
  const std::string file = dir_.file("store.kvs");
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ScopedFd owned(fd);
  struct stat st = {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  const std::string dev =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  if (::access(dev.c_str(), F_OK) != 0) {
    GTEST_SKIP() << dir_.path() << " is not on a block device (" << dev << " does not exist)";
  }
  auto info = posix_io_backend()->stat(fd, file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_TRUE(info->logical_block_known);
  EXPECT_GE(info->logical_block, 512u);
}

}  // namespace
}  // namespace kvtier
