// IoBackend over POSIX files and block devices, with io_uring queues (see io_backend.hpp).
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "kvtier/log.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

std::string at(const std::string& path, uint64_t offset) {
  return path + " at offset " + std::to_string(offset);
}

class PosixIoBackend final : public IoBackend {
 public:
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
    if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align > 0) {
      info.logical_block = sx.stx_dio_offset_align;
    }
#endif
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
    if (options.allow_io_uring) {
      auto q = make_uring_queue(options);
      if (q.ok()) return q;
      if (q.status().code() != StatusCode::kUnavailable) return q;
      log_once(LogLevel::kWarn, "nvme.io_uring",
               "io_uring unavailable (" + q.status().message() +
                   "); NVMe I/O falls back to synchronous preadv/pwritev");
    }
    return make_sync_queue(options);
  }
};

}  // namespace

std::shared_ptr<IoBackend> posix_io_backend() {
  static const std::shared_ptr<IoBackend> backend = std::make_shared<PosixIoBackend>();
  return backend;
}

}  // namespace kvtier
