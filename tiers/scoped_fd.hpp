// ScopedFd: sole owner of one file descriptor. SharedFd: one descriptor several owners hold.
//
// ScopedFd is move-only; the destructor closes without throwing and logs a failed close (on Linux
// the fd is gone either way, so close is never retried — a retry could close a descriptor another
// thread has just been given). `release()` hands the descriptor back to the caller. -1 means
// empty. SharedFd is a copyable handle to a ScopedFd, closed when the last copy goes: a file and
// the operations made with it share one, so a descriptor the file replaces stays open exactly as
// long as an operation still uses it.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "kvtier/log.hpp"

namespace kvtier {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

  int release() noexcept { return std::exchange(fd_, -1); }

  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd);
    if (old >= 0 && ::close(old) != 0) {
      const int err = errno;
      log(LogLevel::kWarn, "close(fd " + std::to_string(old) +
                               ") failed: " + std::string(std::strerror(err)) + " (errno " +
                               std::to_string(err) + ")");
    }
  }

 private:
  int fd_ = -1;
};

class SharedFd {
 public:
  SharedFd() = default;
  explicit SharedFd(ScopedFd fd)
      : fd_(fd.valid() ? std::make_shared<const ScopedFd>(std::move(fd)) : nullptr) {}

  int get() const { return fd_ ? fd_->get() : -1; }
  bool valid() const { return fd_ != nullptr; }

 private:
  std::shared_ptr<const ScopedFd> fd_;
};

}  // namespace kvtier
