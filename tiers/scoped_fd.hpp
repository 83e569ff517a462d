// ScopedFd: sole owner of one file descriptor.
//
// Move-only; the destructor closes without throwing and logs a failed close (on Linux the fd is
// gone either way, so close is never retried — a retry could close a descriptor another thread has
// just been given). `release()` hands the descriptor back to the caller. -1 means empty.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
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

}  // namespace kvtier
