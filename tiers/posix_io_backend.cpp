// IoBackend over POSIX files and block devices, with io_uring queues (see io_backend.hpp).
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "kvtier/log.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

std::string at(const std::string& path, uint64_t offset) {
  return path + " at offset " + std::to_string(offset);
}

constexpr uint32_t kAssumedLogicalBlock = 4096;

// A sysfs attribute holding one block size; 0 when missing, unreadable or not a plausible size.
uint32_t read_block_size(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.pop_back();
  }
  if (text.empty() || text.size() > 6 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  const unsigned long v = std::strtoul(text.c_str(), nullptr, 10);
  if (v < 512 || v > 65536 || (v & (v - 1)) != 0) return 0;
  return static_cast<uint32_t>(v);
}

bool exists(const std::string& path) {
  struct stat st = {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

uint32_t sysfs_logical_block_size(const std::string& sysfs_root, uint32_t major, uint32_t minor) {
  // dev/block/M:m is a link to the device's directory; a partition's sits inside its disk's, and
  // only the disk has a queue/.
  const std::string dev =
      sysfs_root + "/dev/block/" + std::to_string(major) + ":" + std::to_string(minor);
  if (exists(dev + "/partition")) return read_block_size(dev + "/../queue/logical_block_size");
  return read_block_size(dev + "/queue/logical_block_size");
}

namespace {

class PosixIoBackend final : public IoBackend {
 public:
  explicit PosixIoBackend(PosixIoOptions options) : options_(std::move(options)) {}

  Result<ScopedFd> open(const std::string& path, int flags, mode_t mode) override {
    int fd;
    do {
      fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      return errno_status(open_errno_code(err), "open " + path, err);
    }
    return ScopedFd(fd);
  }

  Status make_dirs(const std::string& dir) override {
    if (dir.empty()) return Status();
    std::string partial;
    std::size_t pos = 0;
    while (pos != std::string::npos) {
      const std::size_t next = dir.find('/', pos + 1);
      partial = dir.substr(0, next);
      pos = next;
      if (partial.empty() || partial == "/" || partial == "." || partial == "..") continue;
      if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
        return errno_status(StatusCode::kIoError, "mkdir " + partial, errno);
      }
    }
    return Status();
  }

  Result<bool> is_mount_point(const std::string& dir) override {
    struct stat self = {};
    struct stat parent = {};
    if (::stat(dir.c_str(), &self) != 0) {
      const int err = errno;
      return errno_status(open_errno_code(err), "stat " + dir, err);
    }
    if (!S_ISDIR(self.st_mode)) return invalid_argument(dir + " is not a directory");
    const std::string up = dir + "/..";
    if (::stat(up.c_str(), &parent) != 0) {
      return errno_status(StatusCode::kIoError, "stat " + up, errno);
    }
    // The root is its own parent; any other mount point sits on another device than its parent.
    return self.st_dev != parent.st_dev || self.st_ino == parent.st_ino;
  }

  Result<FileInfo> stat(int fd, const std::string& path) override {
    struct stat st = {};
    if (::fstat(fd, &st) != 0) return errno_status(StatusCode::kIoError, "fstat " + path, errno);
    FileInfo info;
    if (S_ISBLK(st.st_mode)) {
      info.block_device = true;
      info.identified = true;
      info.device = static_cast<uint64_t>(st.st_rdev);
      uint64_t bytes = 0;
      if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
        return errno_status(StatusCode::kIoError, "ioctl(BLKGETSIZE64) " + path, errno);
      }
      info.size = bytes;
      int sector = 0;
      if (::ioctl(fd, BLKSSZGET, &sector) == 0 && sector > 0) {
        info.logical_block = static_cast<uint32_t>(sector);
        info.logical_block_known = true;
      } else {
        device_block(info, major(st.st_rdev), minor(st.st_rdev), path);
      }
      return info;
    }
    if (!S_ISREG(st.st_mode)) {
      return invalid_argument(path + " is neither a regular file nor a block device");
    }
    info.size = static_cast<uint64_t>(st.st_size);
    info.identified = true;
    info.device = static_cast<uint64_t>(st.st_dev);
    info.inode = static_cast<uint64_t>(st.st_ino);
#ifdef STATX_DIOALIGN
    struct statx sx = {};
    if (options_.use_statx_dioalign && ::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align > 0) {
      info.logical_block = sx.stx_dio_offset_align;
      info.logical_block_known = true;
      return info;
    }
#endif
    // Before Linux 6.1, or a filesystem that does not say: the sector size of its device.
    device_block(info, major(st.st_dev), minor(st.st_dev), path);
    return info;
  }

  Status allocate(int fd, const std::string& path, uint64_t size) override {
    int ret;
    do {
      ret = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
    } while (ret != 0 && errno == EINTR);
    if (ret == 0) return Status();
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      return errno_status(io_errno_code(err),
                          "fallocate " + path + " to " + std::to_string(size) + " bytes", err);
    }
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      const int terr = errno;
      return errno_status(io_errno_code(terr),
                          "ftruncate " + path + " to " + std::to_string(size) + " bytes", terr);
    }
    return Status();
  }

  Status read_at(int fd, const std::string& path, void* buf, std::size_t len,
                 uint64_t offset) override {
    auto* p = static_cast<char*>(buf);
    std::size_t done = 0;
    while (done < len) {
      const ssize_t r = ::pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return errno_status(StatusCode::kIoError, "pread " + at(path, offset + done), errno);
      }
      if (r == 0) {
        return io_error("pread " + at(path, offset + done) + ": end of file after " +
                        std::to_string(done) + " of " + std::to_string(len) + " bytes");
      }
      done += static_cast<std::size_t>(r);
    }
    return Status();
  }

  Status write_at(int fd, const std::string& path, const void* buf, std::size_t len,
                  uint64_t offset) override {
    const auto* p = static_cast<const char*>(buf);
    std::size_t done = 0;
    while (done < len) {
      const ssize_t r = ::pwrite(fd, p + done, len - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        const int err = errno;
        return errno_status(io_errno_code(err), "pwrite " + at(path, offset + done), err);
      }
      if (r == 0) return io_error("pwrite " + at(path, offset + done) + ": no progress");
      done += static_cast<std::size_t>(r);
    }
    return Status();
  }

  Status sync(int fd, const std::string& path) override {
    if (::fdatasync(fd) != 0) return errno_status(StatusCode::kIoError, "fdatasync " + path, errno);
    return Status();
  }

  Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& options) override {
    if (options.allow_io_uring && options_.io_uring) {
      auto q = make_uring_queue(options);
      if (q.ok()) return q;
      if (q.status().code() != StatusCode::kUnavailable) return q;
      log_once(LogLevel::kWarn, "nvme.io_uring",
               "io_uring unavailable (" + q.status().message() +
                   "); NVMe I/O falls back to synchronous preadv/pwritev");
    }
    return make_sync_queue(options);
  }

 private:
  // The logical block size of device `maj`:`min` from sysfs, else the assumed 4096, said once.
  void device_block(FileInfo& info, uint32_t maj, uint32_t min, const std::string& path) const {
    const uint32_t size = sysfs_logical_block_size(options_.sysfs_root, maj, min);
    if (size != 0) {
      info.logical_block = size;
      info.logical_block_known = true;
      return;
    }
    info.logical_block = kAssumedLogicalBlock;
    info.logical_block_known = false;
    log_once(LogLevel::kInfo, "nvme.logical_block." + path,
             "O_DIRECT alignment of " + path + " not reported (nor by " + options_.sysfs_root +
                 "/dev/block/" + std::to_string(maj) + ":" + std::to_string(min) +
                 "/queue/logical_block_size); assuming " + std::to_string(kAssumedLogicalBlock) +
                 " bytes");
  }

  const PosixIoOptions options_;
};

}  // namespace

std::shared_ptr<IoBackend> posix_io_backend() {
  static const std::shared_ptr<IoBackend> backend =
      std::make_shared<PosixIoBackend>(PosixIoOptions{});
  return backend;
}

std::shared_ptr<IoBackend> posix_io_backend(const PosixIoOptions& options) {
  return std::make_shared<PosixIoBackend>(options);
}

}  // namespace kvtier
