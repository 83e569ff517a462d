// NvmeStore: format, restart recovery, refusal of foreign or mismatched stores, corruption
// detection, multi-file layout, single-page reads, cancellation and the synchronous fallback.
#include "tiers/nvme_store.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/fault_injection.hpp"

namespace kvtier {
namespace {

using testing::AlignedPages;
using testing::test_key;

const Geometry kGeom = testing::small_geometry(Dtype::kF16, 4, 16, 2, 64);  // 8 KiB pages

class NvmeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  NvmeStoreOptions options(uint32_t blocks = 16, std::vector<std::string> files = {"store0.kvs"}) {
    NvmeStoreOptions o;
    o.config.paths.clear();
    for (const auto& f : files) o.config.paths.push_back(dir_.file(f));
    o.config.queue_depth = 8;
    o.config.capacity_bytes = uint64_t{blocks} * (kGeom.block_bytes() + 4096);
    return o;
  }

  std::unique_ptr<NvmeStore> open(NvmeStoreOptions o, const Geometry& g = kGeom) {
    auto s = NvmeStore::create(g, std::move(o));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // A store of the default options doing its I/O through `backend`.
  std::unique_ptr<NvmeStore> open_with(std::shared_ptr<IoBackend> backend) {
    auto o = options();
    o.backend = std::move(backend);
    return open(std::move(o));
  }

  Status write(NvmeStore& s, uint64_t id, uint64_t seed) {
    AlignedPages p(kGeom.layers, s.page_io_bytes());
    p.fill(seed, kGeom.page_bytes());
    KVTIER_ASSIGN_OR_RETURN(Transfer t, s.write_block(test_key(id), p.const_pages()));
    return t.wait();
  }

  // OK and matching, or the read's error.
  Status read_matches(NvmeStore& s, uint64_t id, uint64_t seed) {
    AlignedPages p(kGeom.layers, s.page_io_bytes());
    p.scribble();
    KVTIER_ASSIGN_OR_RETURN(Transfer t, s.read_block(test_key(id), p.pages()));
    KVTIER_RETURN_IF_ERROR(t.wait());
    if (!p.matches(seed, kGeom.page_bytes())) return internal_error("data differs");
    return Status();
  }

  void expect_audit(const NvmeStore& s) {
    Status a = s.audit();
    EXPECT_TRUE(a.ok()) << a.to_string();
  }

  testing::TempDir dir_;
};

TEST_F(NvmeStoreTest, CreatesFilesWithOwnerOnlyPermissions) {
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  struct stat st = {};
  ASSERT_EQ(::stat(dir_.file("store0.kvs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(s->capacity_blocks(), 16u);
  EXPECT_EQ(s->used_blocks(), 0u);
  EXPECT_EQ(s->layout().page_stride % 512, 0u);
  EXPECT_EQ(s->layout().header_bytes % 4096, 0u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, CreatesMissingParentDirectories) {
  auto o = options();
  o.config.paths = {dir_.file("a/b/c/store.kvs")};
  auto s = open(std::move(o));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(write(*s, 1, 1).ok());
}

TEST_F(NvmeStoreTest, RecoversBlocksAfterRestart) {
  std::set<BlockKey> written;
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    for (uint64_t id = 0; id < 10; ++id) {
      ASSERT_TRUE(write(*s, id, id + 100).ok());
      written.insert(test_key(id));
    }
    ASSERT_TRUE(s->erase(test_key(3)).ok());  // erase is in memory only: 3 may come back
    expect_audit(*s);
  }
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  auto keys = s->keys();
  std::set<BlockKey> got(keys.begin(), keys.end());
  EXPECT_EQ(got, written);  // the erased block's extent was not reused, so it is found again
  EXPECT_EQ(s->stats().recovered_blocks.load(), 10u);
  for (uint64_t id = 0; id < 10; ++id) {
    Status r = read_matches(*s, id, id + 100);
    EXPECT_TRUE(r.ok()) << id << ": " << r.to_string();
  }
  // New writes continue after the recovered ones.
  ASSERT_TRUE(write(*s, 50, 50).ok());
  EXPECT_TRUE(read_matches(*s, 50, 50).ok());
  EXPECT_EQ(s->used_blocks(), 11u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, NewestGenerationWinsWhenAKeyIsFoundTwice) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 11).ok());  // extent A, generation 1
    ASSERT_TRUE(write(*s, 2, 22).ok());  // extent B
    ASSERT_TRUE(s->erase(test_key(1)).ok());
    ASSERT_TRUE(s->erase(test_key(2)).ok());
    // The free stack now yields B first: key 1 is rewritten (other bytes) into B with a newer
    // generation while A still holds the old copy on disk.
    ASSERT_TRUE(write(*s, 1, 12).ok());
  }
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->keys(), std::vector<BlockKey>{test_key(1)});
  EXPECT_TRUE(read_matches(*s, 1, 12).ok());
  EXPECT_GE(s->stats().dropped_extents.load(), 1u);
  EXPECT_EQ(s->used_blocks(), 1u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, RefusesAStoreOfAnotherGeometry) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 1).ok());
  }
  Geometry other = kGeom;
  other.kv_heads = 4;
  auto s = NvmeStore::create(other, options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("kv_heads=2"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("kv_heads=4"), std::string::npos);
  EXPECT_NE(s.status().message().find("store0.kvs"), std::string::npos);
  // The refused store is intact.
  auto again = open(options());
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(read_matches(*again, 1, 1).ok());
}

TEST_F(NvmeStoreTest, RefusesToOverwriteAForeignFile) {
  const std::string path = dir_.file("store0.kvs");
  {
    std::ofstream f(path);
    f << "precious data that is not a kvtier store";
  }
  auto s = NvmeStore::create(kGeom, options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("not a kvtier store"), std::string::npos);
  std::ifstream f(path);
  std::string content;
  std::getline(f, content);
  EXPECT_EQ(content, "precious data that is not a kvtier store");
}

TEST_F(NvmeStoreTest, APathThatCannotBeCreatedNamesPathAndErrno) {
  {
    std::ofstream f(dir_.file("plainfile"));
    f << "x";
  }
  auto o = options();
  o.config.paths = {dir_.file("plainfile/store.kvs")};
  auto s = NvmeStore::create(kGeom, std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError);
  EXPECT_NE(s.status().message().find("plainfile"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("errno"), std::string::npos);
  EXPECT_NE(s.status().message().find("tiers.nvme.paths[0]"), std::string::npos);
}

TEST_F(NvmeStoreTest, RejectsBadConfiguration) {
  auto o = options();
  o.config.queue_depth = 0;
  EXPECT_EQ(NvmeStore::create(kGeom, o).status().code(), StatusCode::kInvalidArgument);
  o = options();
  o.config.paths.clear();
  EXPECT_EQ(NvmeStore::create(kGeom, o).status().code(), StatusCode::kInvalidArgument);
  o = options();
  o.config.capacity_bytes = 100;  // less than one extent
  auto s = NvmeStore::create(kGeom, o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("capacity_bytes"), std::string::npos);
}

TEST_F(NvmeStoreTest, SpreadsExtentsOverSeveralFilesAndRecoversThemAll) {
  const std::vector<std::string> files = {"s0.kvs", "s1.kvs"};
  {
    auto s = open(options(8, files));
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->capacity_blocks(), 8u);
    std::set<std::string> paths;
    for (uint64_t id = 0; id < 8; ++id) {
      ASSERT_TRUE(write(*s, id, id).ok());
      auto where = s->locate(test_key(id));
      ASSERT_TRUE(where.ok());
      paths.insert(where->path);
    }
    EXPECT_EQ(paths.size(), 2u);
  }
  // The files must be listed as before.
  auto swapped = NvmeStore::create(kGeom, options(8, {"s1.kvs", "s0.kvs"}));
  EXPECT_EQ(swapped.status().code(), StatusCode::kFailedPrecondition);
  auto partial = NvmeStore::create(kGeom, options(8, {"s0.kvs", "s1.kvs", "s2.kvs"}));
  EXPECT_EQ(partial.status().code(), StatusCode::kFailedPrecondition);

  auto s = open(options(8, files));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->keys().size(), 8u);
  for (uint64_t id = 0; id < 8; ++id) EXPECT_TRUE(read_matches(*s, id, id).ok()) << id;
  expect_audit(*s);
}

// Two paths naming one file would give two files' extents the same offsets: blocks would overwrite
// each other. The store refuses them before it formats (or overwrites) anything.
TEST_F(NvmeStoreTest, RefusesTwoPathsNamingTheSameFile) {
  const std::string f = dir_.file("s0.kvs");
  auto o = options(8, {"s0.kvs"});
  o.config.paths = {f, dir_.path() + "/./s0.kvs"};
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tiers.nvme.paths[0]"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("[1]"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("same file"), std::string::npos) << s.status().message();
  struct stat st = {};
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the refused file was formatted";

  // A hard link to the (still empty) file, listed after an unrelated one.
  const std::string link = dir_.file("link.kvs");
  ASSERT_EQ(::link(f.c_str(), link.c_str()), 0);
  o.config.paths = {f, dir_.file("other.kvs"), link};
  s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tiers.nvme.paths[0]"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("[2]"), std::string::npos) << s.status().message();
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the refused file was formatted";
}

TEST_F(NvmeStoreTest, RefusesASymlinkToAnExistingStoreFileAndLeavesItIntact) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 1).ok());
  }
  const std::string alias = dir_.file("alias.kvs");
  ASSERT_EQ(::symlink(dir_.file("store0.kvs").c_str(), alias.c_str()), 0);
  auto o = options();
  o.config.paths.push_back(alias);
  auto s = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().to_string();
  EXPECT_NE(s.status().message().find("same file"), std::string::npos) << s.status().message();
  auto again = open(options());
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(read_matches(*again, 1, 1).ok());
}

// Where statx reports no O_DIRECT alignment (Linux < 6.1, or a filesystem that does not say), the
// store aligns to its device's logical block size from sysfs: 4 KiB here, where 512 would fail
// every O_DIRECT I/O on a 4 KiB-sector drive. A fake sysfs stands in for the drive.
TEST_F(NvmeStoreTest, AlignsToTheDevicesSectorSizeWhenTheFilesystemDoesNotSay) {
  struct stat st = {};
  ASSERT_EQ(::stat(dir_.path().c_str(), &st), 0);
  const std::string sys = dir_.file("sys");
  const std::string queue = sys + "/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                            std::to_string(minor(st.st_dev)) + "/queue";
  std::filesystem::create_directories(queue);
  std::ofstream(queue + "/logical_block_size") << "4096\n";
  PosixIoOptions io;
  io.sysfs_root = sys;
  io.use_statx_dioalign = false;
  auto o = options();
  o.backend = posix_io_backend(io);
  {
    auto s = open(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->layout().io_align, 4096u);
    EXPECT_EQ(s->buffer_alignment(), 4096u);
    EXPECT_EQ(s->layout().page_stride % 4096, 0u);
    ASSERT_TRUE(write(*s, 1, 1).ok());
    Status r = read_matches(*s, 1, 1);
    EXPECT_TRUE(r.ok()) << r.to_string();
  }
  // The store's alignment is in its superblock: the default backend reopens it as it is.
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->layout().io_align, 4096u);
  Status r = read_matches(*s, 1, 1);
  EXPECT_TRUE(r.ok()) << r.to_string();
  expect_audit(*s);
}

// An existing store at 512-byte alignment: a device that reports 4 KiB sectors refuses it (its
// O_DIRECT I/O would fail), but the assumed 4096 of a device nobody reports on does not.
TEST_F(NvmeStoreTest, OnlyAReportedBlockSizeRefusesAnExistingStore) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    if (s->layout().io_align != 512) {
      GTEST_SKIP() << "the temporary directory's filesystem needs " << s->layout().io_align
                   << "-byte O_DIRECT alignment, so no 512-aligned store can be made here";
    }
    ASSERT_TRUE(write(*s, 1, 7).ok());
  }
  PosixIoOptions io;
  io.use_statx_dioalign = false;
  io.sysfs_root = dir_.file("empty-sys");  // knows no device: 4096 assumed
  auto o = options();
  o.backend = posix_io_backend(io);
  {
    auto s = open(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->layout().io_align, 512u);
    Status r = read_matches(*s, 1, 7);
    EXPECT_TRUE(r.ok()) << r.to_string();
  }
  struct stat st = {};
  ASSERT_EQ(::stat(dir_.path().c_str(), &st), 0);
  const std::string sys = dir_.file("sys");
  const std::string queue = sys + "/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                            std::to_string(minor(st.st_dev)) + "/queue";
  std::filesystem::create_directories(queue);
  std::ofstream(queue + "/logical_block_size") << "4096\n";
  io.sysfs_root = sys;
  o.backend = posix_io_backend(io);
  auto refused = NvmeStore::create(kGeom, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("needs 4096"), std::string::npos)
      << refused.status().message();
}

TEST_F(NvmeStoreTest, ReadsOnePageOfABlock) {
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(write(*s, 7, 70).ok());
  for (uint32_t layer = 0; layer < kGeom.layers; ++layer) {
    AlignedPages one(1, s->page_io_bytes());
    one.scribble();
    auto t = s->read_page(test_key(7), layer, one[0]);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->wait().ok());
    EXPECT_TRUE(testing::matches_pattern(one[0], kGeom.page_bytes(), 70 * 1000 + layer)) << layer;
  }
  EXPECT_EQ(s->read_page(test_key(7), kGeom.layers, nullptr).status().code(),
            StatusCode::kOutOfRange);
  AlignedPages one(1, s->page_io_bytes());
  EXPECT_EQ(s->read_page(test_key(8), 0, one[0]).status().code(), StatusCode::kNotFound);
}

TEST_F(NvmeStoreTest, ValidatesRequests) {
  auto s = open(options(2));
  ASSERT_NE(s, nullptr);
  AlignedPages p(kGeom.layers, s->page_io_bytes());
  p.fill(1, kGeom.page_bytes());
  // Wrong page count.
  const auto all = p.const_pages();
  std::vector<const std::byte*> three(all.begin(), all.begin() + 3);
  EXPECT_EQ(s->write_block(test_key(1), three).status().code(), StatusCode::kInvalidArgument);
  // Misaligned buffer (O_DIRECT needs alignment).
  auto bad = p.const_pages();
  bad[1] += 8;
  const auto misaligned = s->write_block(test_key(1), bad).status();
  EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.message().find("page buffer of layer 1"), std::string::npos)
      << misaligned.to_string();
  // Reads check their buffers the same way, before looking the key up.
  auto read_pages = p.pages();
  std::vector<std::byte*> read_three(read_pages.begin(), read_pages.begin() + 3);
  const auto short_read = s->read_block(test_key(1), read_three).status();
  EXPECT_EQ(short_read.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_read.message().find("3 page buffers"), std::string::npos)
      << short_read.to_string();
  read_pages[0] = nullptr;
  EXPECT_EQ(s->read_block(test_key(1), read_pages).status().code(), StatusCode::kInvalidArgument);
  // Unknown key.
  EXPECT_EQ(s->read_block(test_key(1), p.pages()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->erase(test_key(1)).code(), StatusCode::kNotFound);
  // Equal keys mean equal bytes: a second write of a written block is refused as already present.
  ASSERT_TRUE(write(*s, 1, 1).ok());
  EXPECT_EQ(s->write_block(test_key(1), p.const_pages()).status().code(),
            StatusCode::kAlreadyExists);
  // Full.
  ASSERT_TRUE(write(*s, 2, 2).ok());
  auto full = s->write_block(test_key(3), p.const_pages());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("full"), std::string::npos);
  EXPECT_EQ(s->used_blocks(), 2u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, CorruptPageIsDroppedNeverServed) {
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(write(*s, 1, 5).ok());
  ASSERT_TRUE(write(*s, 2, 6).ok());
  auto where = s->locate(test_key(1));
  ASSERT_TRUE(where.ok());
  ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(
                  where->path, where->offset + s->layout().page_offset(2) + 123)
                  .ok());
  Status r = read_matches(*s, 1, 5);
  EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r.to_string();
  EXPECT_NE(r.message().find("layer 2"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("store0.kvs"), std::string::npos);
  EXPECT_FALSE(s->contains(test_key(1)));
  EXPECT_EQ(read_matches(*s, 1, 5).code(), StatusCode::kNotFound);  // a miss from now on
  EXPECT_TRUE(read_matches(*s, 2, 6).ok());                         // its neighbour is fine
  EXPECT_EQ(s->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(s->used_blocks(), 1u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, CorruptPageFailsASinglePageReadToo) {
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(write(*s, 1, 5).ok());
  auto where = s->locate(test_key(1));
  ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(where->path,
                                                         where->offset + s->layout().page_offset(0))
                  .ok());
  AlignedPages one(1, s->page_io_bytes());
  auto t = s->read_page(test_key(1), 0, one[0]);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->wait().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(s->contains(test_key(1)));
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, TornHeaderIsDroppedAtRecovery) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 1).ok());
    ASSERT_TRUE(write(*s, 2, 2).ok());
    auto where = s->locate(test_key(1));
    ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(where->path, where->offset + 20).ok());
  }
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->keys(), std::vector<BlockKey>{test_key(2)});
  EXPECT_EQ(s->stats().dropped_extents.load(), 1u);
  EXPECT_TRUE(read_matches(*s, 2, 2).ok());
  EXPECT_EQ(s->used_blocks(), 1u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, TornPageSurvivesRecoveryButFailsOnRead) {
  {
    auto s = open(options());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 1).ok());
    auto where = s->locate(test_key(1));
    ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(
                    where->path, where->offset + s->layout().page_offset(3) + 7)
                    .ok());
  }
  auto s = open(options());
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->contains(test_key(1)));  // headers are checked at start, pages when read
  EXPECT_EQ(read_matches(*s, 1, 1).code(), StatusCode::kDataLoss);
  EXPECT_FALSE(s->contains(test_key(1)));
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, Crc32cChecksumsWork) {
  auto o = options();
  o.config.checksum = ChecksumKind::kCrc32c;
  {
    auto s = open(o);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(write(*s, 1, 1).ok());
  }
  auto s = open(o);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(read_matches(*s, 1, 1).ok());
  auto where = s->locate(test_key(1));
  ASSERT_TRUE(FaultInjectingIoBackend::flip_byte_on_disk(where->path,
                                                         where->offset + s->layout().page_offset(1))
                  .ok());
  EXPECT_EQ(read_matches(*s, 1, 1).code(), StatusCode::kDataLoss);
}

// An IoBackend that hands every call to `inner_`; the doubles below change only their queues.
class ForwardingBackend : public IoBackend {
 public:
  Result<ScopedFd> open(const std::string& p, int f, mode_t m) override {
    return inner_->open(p, f, m);
  }
  Status make_dirs(const std::string& d) override { return inner_->make_dirs(d); }
  Result<bool> is_mount_point(const std::string& d) override { return inner_->is_mount_point(d); }
  Result<FileInfo> stat(int fd, const std::string& p) override { return inner_->stat(fd, p); }
  Status allocate(int fd, const std::string& p, uint64_t n) override {
    return inner_->allocate(fd, p, n);
  }
  Status read_at(int fd, const std::string& p, void* b, std::size_t n, uint64_t o) override {
    return inner_->read_at(fd, p, b, n, o);
  }
  Status write_at(int fd, const std::string& p, const void* b, std::size_t n, uint64_t o) override {
    return inner_->write_at(fd, p, b, n, o);
  }
  Status sync(int fd, const std::string& p) override { return inner_->sync(fd, p); }

 protected:
  std::shared_ptr<IoBackend> inner_ = posix_io_backend();
};

// A backend whose first submit blocks until released, so operations pile up in the queue.
class GatedBackend final : public ForwardingBackend {
 public:
  explicit GatedBackend(std::shared_ptr<IoBackend> inner = posix_io_backend()) {
    inner_ = std::move(inner);
  }

  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::promise<void> reached;

  Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& o) override {
    KVTIER_ASSIGN_OR_RETURN(auto q, inner_->make_queue(o));
    return std::unique_ptr<IoQueue>(std::make_unique<Queue>(*this, std::move(q)));
  }

 private:
  class Queue final : public IoQueue {
   public:
    Queue(GatedBackend& b, std::unique_ptr<IoQueue> q) : b_(b), q_(std::move(q)) {}
    std::string_view kind() const override { return q_->kind(); }
    uint32_t depth() const override { return q_->depth(); }
    Status register_buffers(std::span<const iovec> v) override { return q_->register_buffers(v); }
    Result<std::size_t> submit(std::span<const IoRequest> r) override {
      if (first_) {
        first_ = false;
        b_.reached.set_value();
        b_.opened.wait();
      }
      return q_->submit(r);
    }
    Status wait(std::vector<IoCompletion>& out, int t) override { return q_->wait(out, t); }
    void wake() noexcept override { q_->wake(); }

   private:
    GatedBackend& b_;
    std::unique_ptr<IoQueue> q_;
    bool first_ = true;
  };
};

// A write of block `id` (pattern `seed`) that the gated backend holds inside its first submit, and
// the pages it writes from, which must live until it completes.
struct HeldWrite {
  AlignedPages pages;
  Result<Transfer> transfer;
};
HeldWrite hold_write(NvmeStore& s, GatedBackend& gated, uint64_t id, uint64_t seed) {
  HeldWrite w{AlignedPages(kGeom.layers, s.page_io_bytes()), Transfer()};
  w.pages.fill(seed, kGeom.page_bytes());
  w.transfer = s.write_block(test_key(id), w.pages.const_pages());
  if (w.transfer.ok()) gated.reached.get_future().wait();
  return w;
}

TEST_F(NvmeStoreTest, CancelledOperationsNeverStartAndLeaveNoTrace) {
  auto gated = std::make_shared<GatedBackend>();
  auto s = open_with(gated);
  ASSERT_NE(s, nullptr);
  AlignedPages p(kGeom.layers, s->page_io_bytes());
  p.fill(3, kGeom.page_bytes());
  // The first write blocks the I/O thread inside submit; the next ones wait in its inbox.
  auto first = s->write_block(test_key(1), p.const_pages());
  ASSERT_TRUE(first.ok());
  gated->reached.get_future().wait();
  std::vector<Transfer> later;
  for (uint64_t id = 2; id < 6; ++id) {
    auto t = s->write_block(test_key(id), p.const_pages());
    ASSERT_TRUE(t.ok());
    t->cancel();
    later.push_back(std::move(t).value());
  }
  gated->gate.set_value();
  EXPECT_TRUE(first->wait().ok());
  for (auto& t : later) EXPECT_EQ(t.wait().code(), StatusCode::kCancelled);
  EXPECT_TRUE(s->contains(test_key(1)));
  for (uint64_t id = 2; id < 6; ++id) EXPECT_FALSE(s->contains(test_key(id)));
  EXPECT_EQ(s->used_blocks(), 1u);
  EXPECT_EQ(s->stats().link(Link::kHostToNvme).cancelled.load(), 4u);
  EXPECT_EQ(s->stats().link(Link::kHostToNvme).ops.load(), 1u);
  expect_audit(*s);
}

// A read names what it asked for and why it cannot be served: a block still being written (its
// extent holds nothing yet) or one the store does not hold. Once the write lands, both reads work.
TEST_F(NvmeStoreTest, ReadsOfABlockBeingWrittenOrAbsentAreRefusedByName) {
  auto gated = std::make_shared<GatedBackend>();
  auto s = open_with(gated);
  ASSERT_NE(s, nullptr);
  HeldWrite written = hold_write(*s, *gated, 1, 5);
  ASSERT_TRUE(written.transfer.ok());
  AlignedPages dst(kGeom.layers, s->page_io_bytes());
  const Status block = s->read_block(test_key(1), dst.pages()).status();
  EXPECT_EQ(block.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(block.message().find("read_block"), std::string::npos) << block.message();
  EXPECT_NE(block.message().find("still being written"), std::string::npos) << block.message();
  const Status page = s->read_page(test_key(1), 1, dst[0]).status();
  EXPECT_EQ(page.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(page.message().find("read_page"), std::string::npos) << page.message();
  EXPECT_NE(page.message().find("layer 1"), std::string::npos) << page.message();
  const Status absent = s->read_page(test_key(2), 0, dst[0]).status();
  EXPECT_EQ(absent.code(), StatusCode::kNotFound);
  EXPECT_NE(absent.message().find("not in the NVMe store"), std::string::npos) << absent.message();
  gated->gate.set_value();
  ASSERT_TRUE(written.transfer->wait().ok());
  auto read = s->read_block(test_key(1), dst.pages());
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(read->wait().ok());
  EXPECT_TRUE(testing::matches_pattern(dst[1], kGeom.page_bytes(), 5 * 1000 + 1));
  expect_audit(*s);  // the refused reads left no reader counted on the extent
}

// Erase while the write is in flight, then the same key again: the rewrite joins the write in
// flight (the block is wanted after all), so the block must survive the first write's completion
// rather than be erased by it, and both callers are told it is written.
TEST_F(NvmeStoreTest, RewriteAfterEraseDuringTheWriteKeepsTheBlock) {
  auto gated = std::make_shared<GatedBackend>();
  auto s = open_with(gated);
  ASSERT_NE(s, nullptr);
  HeldWrite held = hold_write(*s, *gated, 1, 5);
  ASSERT_TRUE(held.transfer.ok());
  Result<Transfer>& first = held.transfer;
  const AlignedPages& p = held.pages;
  // Until the gate opens, a failed check must not return: the held write would never finish.
  EXPECT_TRUE(s->erase(test_key(1)).ok());
  std::promise<Status> called;
  TransferOptions then;
  then.on_complete = [&called](const Status& st) { called.set_value(st); };
  auto again = s->write_block(test_key(1), p.const_pages(), std::move(then));
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  if (again.ok()) {
    again->cancel();  // a joined write has no I/O of its own to cancel
    EXPECT_FALSE(again->done());
  }
  gated->gate.set_value();
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(first->wait().ok());
  Status joined = again->wait();
  EXPECT_TRUE(joined.ok()) << joined.to_string();
  EXPECT_TRUE(called.get_future().get().ok());
  EXPECT_TRUE(s->contains(test_key(1)));
  Status r = read_matches(*s, 1, 5);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(s->used_blocks(), 1u);
  // One block went to disk, once: the joined write is not counted as a second one.
  EXPECT_EQ(s->stats().link(Link::kHostToNvme).ops.load(), 1u);
  EXPECT_EQ(s->stats().link(Link::kHostToNvme).bytes.load(), kGeom.block_bytes());
  // Now that it is readable, a rewrite is refused as present.
  EXPECT_EQ(s->write_block(test_key(1), p.const_pages()).status().code(),
            StatusCode::kAlreadyExists);
  expect_audit(*s);

  // Erase during a write without a rewrite still erases the block once it is written.
  auto gated2 = std::make_shared<GatedBackend>();
  auto o2 = options(16, {"store1.kvs"});
  o2.backend = gated2;
  auto s2 = open(std::move(o2));
  ASSERT_NE(s2, nullptr);
  auto w = s2->write_block(test_key(2), p.const_pages());
  ASSERT_TRUE(w.ok());
  gated2->reached.get_future().wait();
  ASSERT_TRUE(s2->erase(test_key(2)).ok());
  gated2->gate.set_value();
  EXPECT_TRUE(w->wait().ok());
  EXPECT_FALSE(s2->contains(test_key(2)));
  EXPECT_EQ(s2->used_blocks(), 0u);
  expect_audit(*s2);
}

// The first write of a block fails (EIO) after a second write of it came, with or without an erase
// in between. The second caller must hear of the failure, not "already exists" (which counts as
// present): nothing is lost unseen, nothing is served, and the block can be written again.
TEST_F(NvmeStoreTest, ARewriteJoinedToAWriteThatFailsIsToldItFailed) {
  for (const bool erase_between : {true, false}) {
    SCOPED_TRACE(erase_between ? "erase between the writes" : "no erase");
    auto faults = std::make_shared<FaultInjectingIoBackend>();
    auto gated = std::make_shared<GatedBackend>(faults);
    auto o = options(16, {erase_between ? "erased.kvs" : "plain.kvs"});
    o.backend = gated;
    auto s = open(std::move(o));
    ASSERT_NE(s, nullptr);
    AlignedPages p(kGeom.layers, s->page_io_bytes());
    p.fill(6, kGeom.page_bytes());
    faults->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1, EIO});
    auto first = s->write_block(test_key(1), p.const_pages());
    ASSERT_TRUE(first.ok());
    gated->reached.get_future().wait();  // the write is held inside submit
    // Until the gate opens, a failed check must not return: the held write would never finish.
    if (erase_between) {
      EXPECT_TRUE(s->erase(test_key(1)).ok());
    }
    auto again = s->write_block(test_key(1), p.const_pages());
    EXPECT_TRUE(again.ok()) << again.status().to_string();
    gated->gate.set_value();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(first->wait().code(), StatusCode::kIoError);
    Status joined = again->wait();
    EXPECT_EQ(joined.code(), StatusCode::kIoError) << joined.to_string();
    EXPECT_NE(joined.message().find("joined"), std::string::npos) << joined.message();
    EXPECT_NE(joined.message().find("errno 5"), std::string::npos) << joined.message();
    EXPECT_EQ(faults->injected(), 1u);
    EXPECT_FALSE(s->contains(test_key(1)));
    EXPECT_TRUE(s->keys().empty());
    EXPECT_EQ(s->read_block(test_key(1), p.pages()).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(s->used_blocks(), 0u);
    EXPECT_EQ(s->stats().link(Link::kHostToNvme).errors.load(), 1u);
    expect_audit(*s);
    // The caller may write it again, and this time it lands.
    Status w = write(*s, 1, 6);
    ASSERT_TRUE(w.ok()) << w.to_string();
    Status r = read_matches(*s, 1, 6);
    EXPECT_TRUE(r.ok()) << r.to_string();
    expect_audit(*s);
  }
}

// A write cancelled before its I/O started takes the writes that joined it along: they complete
// with kCancelled (the block is not written), never OK.
TEST_F(NvmeStoreTest, ARewriteJoinedToACancelledWriteIsCancelledToo) {
  auto gated = std::make_shared<GatedBackend>();
  auto s = open_with(gated);
  ASSERT_NE(s, nullptr);
  AlignedPages p(kGeom.layers, s->page_io_bytes());
  p.fill(8, kGeom.page_bytes());
  auto blocker = s->write_block(test_key(9), p.const_pages());
  ASSERT_TRUE(blocker.ok());
  gated->reached.get_future().wait();  // the I/O thread is held; the next write waits its turn
  // Until the gate opens, a failed check must not return: the held write would never finish.
  auto first = s->write_block(test_key(1), p.const_pages());
  EXPECT_TRUE(first.ok());
  if (first.ok()) first->cancel();
  auto again = s->write_block(test_key(1), p.const_pages());
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  gated->gate.set_value();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(blocker->wait().ok());
  EXPECT_EQ(first->wait().code(), StatusCode::kCancelled);
  Status joined = again->wait();
  EXPECT_EQ(joined.code(), StatusCode::kCancelled) << joined.to_string();
  EXPECT_FALSE(s->contains(test_key(1)));
  EXPECT_EQ(s->used_blocks(), 1u);
  expect_audit(*s);
  ASSERT_TRUE(write(*s, 1, 8).ok());
  EXPECT_TRUE(read_matches(*s, 1, 8).ok());
}

// The synchronous queue stands in when io_uring is refused; everything else is the same.
class NoUringBackend final : public ForwardingBackend {
 public:
  Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& o) override {
    return make_sync_queue(o);
  }
};

TEST_F(NvmeStoreTest, SynchronousFallbackQueueBehavesTheSame) {
  auto o = options();
  o.backend = std::make_shared<NoUringBackend>();
  o.config.io_threads = 2;
  {
    auto s = open(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->io_kind(), "sync");
    EXPECT_FALSE(s->fixed_buffers_active());
    for (uint64_t id = 0; id < 6; ++id) ASSERT_TRUE(write(*s, id, id).ok());
    for (uint64_t id = 0; id < 6; ++id) EXPECT_TRUE(read_matches(*s, id, id).ok());
  }
  auto s = open(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->keys().size(), 6u);
  expect_audit(*s);
}

// A queue that takes one request per submit call: the store must hold the rest back, in order,
// and lose none of them.
class OneAtATimeBackend final : public ForwardingBackend {
 public:
  Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& o) override {
    KVTIER_ASSIGN_OR_RETURN(auto q, inner_->make_queue(o));
    return std::unique_ptr<IoQueue>(std::make_unique<Queue>(std::move(q)));
  }

 private:
  class Queue final : public IoQueue {
   public:
    explicit Queue(std::unique_ptr<IoQueue> q) : q_(std::move(q)) {}
    std::string_view kind() const override { return q_->kind(); }
    uint32_t depth() const override { return q_->depth(); }
    Status register_buffers(std::span<const iovec> v) override { return q_->register_buffers(v); }
    Result<std::size_t> submit(std::span<const IoRequest> r) override {
      return q_->submit(r.first(std::min<std::size_t>(r.size(), 1)));
    }
    Status wait(std::vector<IoCompletion>& out, int t) override { return q_->wait(out, t); }
    void wake() noexcept override { q_->wake(); }

   private:
    std::unique_ptr<IoQueue> q_;
  };
};

TEST_F(NvmeStoreTest, AFullSubmissionQueueDelaysButNeverDropsRequests) {
  // Registered buffers make every write two requests (header, pages), so the second one of each
  // always finds the queue "full" and must be held back.
  AlignedPages pool(12 * kGeom.layers, kGeom.page_bytes());
  auto o = options();
  o.backend = std::make_shared<OneAtATimeBackend>();
  o.fixed_buffers = {iovec{pool.base(), pool.total_bytes()}};
  auto s = open(std::move(o));
  ASSERT_NE(s, nullptr);
  std::vector<Transfer> writes;
  for (uint64_t id = 0; id < 12; ++id) {
    std::vector<const std::byte*> pages;
    for (uint32_t l = 0; l < kGeom.layers; ++l) {
      std::byte* p = pool[id * kGeom.layers + l];
      testing::fill_pattern(p, kGeom.page_bytes(), id * 1000 + l);
      pages.push_back(p);
    }
    auto w = s->write_block(test_key(id), pages);
    ASSERT_TRUE(w.ok());
    writes.push_back(std::move(w).value());
  }
  for (auto& w : writes) EXPECT_TRUE(w.wait().ok());
  for (uint64_t id = 0; id < 12; ++id) EXPECT_TRUE(read_matches(*s, id, id).ok()) << id;
  if (s->fixed_buffers_active()) {
    EXPECT_GE(s->stats().sq_full_waits.load(), 12u);
  }
  EXPECT_EQ(s->stats().link(Link::kHostToNvme).ops.load(), 12u);
  expect_audit(*s);
}

TEST_F(NvmeStoreTest, SqpollRingWorksOrFallsBackToAPlainRing) {
  auto o = options();
  o.config.sqpoll = true;
  auto s = open(std::move(o));
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->io_kind() == "io_uring+sqpoll" || s->io_kind() == "io_uring" ||
              s->io_kind() == "sync");
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(write(*s, id, id + 1).ok());
  for (uint64_t id = 0; id < 4; ++id) EXPECT_TRUE(read_matches(*s, id, id + 1).ok());
}

TEST_F(NvmeStoreTest, FixedBuffersCarryIoWhenRegistered) {
  AlignedPages pool(kGeom.layers * 2, kGeom.page_bytes());
  auto o = options();
  o.fixed_buffers = {iovec{pool.base(), pool.total_bytes()}};
  auto s = open(std::move(o));
  ASSERT_NE(s, nullptr);
  if (s->io_kind() == "sync") GTEST_SKIP() << "io_uring refused here: no fixed buffers to test";
  EXPECT_TRUE(s->fixed_buffers_active());
  std::vector<const std::byte*> src;
  std::vector<std::byte*> dst;
  for (uint32_t l = 0; l < kGeom.layers; ++l) {
    testing::fill_pattern(pool[l], kGeom.page_bytes(), 9000 + l);
    src.push_back(pool[l]);
    dst.push_back(pool[kGeom.layers + l]);
  }
  auto w = s->write_block(test_key(1), src);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->wait().ok());
  auto r = s->read_block(test_key(1), dst);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->wait().ok());
  for (uint32_t l = 0; l < kGeom.layers; ++l) {
    EXPECT_TRUE(testing::matches_pattern(dst[l], kGeom.page_bytes(), 9000 + l));
  }
}

TEST_F(NvmeStoreTest, ConcurrentWritersReadersAndErasers) {
  auto o = options(64);
  o.config.io_threads = 2;
  auto s = open(std::move(o));
  ASSERT_NE(s, nullptr);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        std::vector<Transfer> writes;
        std::vector<AlignedPages> bufs;
        for (uint64_t i = 0; i < 12; ++i) {
          bufs.emplace_back(kGeom.layers, s->page_io_bytes());
          bufs.back().fill(t * 100 + i + round, kGeom.page_bytes());
        }
        for (uint64_t i = 0; i < 12; ++i) {
          auto w = s->write_block(test_key(t * 100 + i), bufs[i].const_pages());
          if (!w.ok()) {
            ++bad;
            continue;
          }
          writes.push_back(std::move(w).value());
        }
        for (auto& w : writes) bad += w.wait().ok() ? 0 : 1;
        for (uint64_t i = 0; i < 12; ++i) {
          if (!read_matches(*s, t * 100 + i, t * 100 + i + round).ok()) ++bad;
          if (!s->erase(test_key(t * 100 + i)).ok()) ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s->used_blocks(), 0u);
  expect_audit(*s);
}

}  // namespace
}  // namespace kvtier
