// IoQueue without io_uring: requests run with preadv/pwritev on the thread that calls wait().
//
// The fallback when the kernel or a sandbox refuses io_uring. One request at a time means no
// device-level parallelism per I/O thread, so throughput drops, but every contract of IoQueue
// holds (prefix acceptance, one completion per request, short counts reported as such).
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <deque>

#include "tiers/io_backend.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

class SyncQueue final : public IoQueue {
 public:
  SyncQueue(uint32_t depth, ScopedFd wake_fd) : depth_(depth), wake_fd_(std::move(wake_fd)) {}

  std::string_view kind() const override { return "sync"; }
  uint32_t depth() const override { return depth_; }
  Status register_buffers(std::span<const iovec>) override {
    return unavailable("the synchronous I/O queue has no fixed buffers");
  }

  Result<std::size_t> submit(std::span<const IoRequest> requests) override {
    std::size_t n = 0;
    for (const IoRequest& r : requests) {
      if (pending_.size() >= depth_) break;
      pending_.push_back(r);
      ++n;
    }
    return n;
  }

  Status wait(std::vector<IoCompletion>& out, int timeout_ms) override {
    if (pending_.empty()) {
      pollfd p = {wake_fd_.get(), POLLIN, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r > 0) {
        uint64_t v;
        while (::read(wake_fd_.get(), &v, sizeof(v)) < 0 && errno == EINTR) {
        }
      }
      return Status();
    }
    while (!pending_.empty()) {
      const IoRequest r = pending_.front();
      pending_.pop_front();
      ssize_t done;
      do {
        done =
            r.opcode == IoOpcode::kRead
                ? ::preadv(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset))
                : ::pwritev(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset));
      } while (done < 0 && errno == EINTR);
      out.push_back(IoCompletion{r.tag, done < 0 ? -errno : static_cast<int32_t>(done)});
    }
    return Status();
  }

  void wake() noexcept override {
    const uint64_t one = 1;
    while (::write(wake_fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

 private:
  const uint32_t depth_;
  ScopedFd wake_fd_;
  std::deque<IoRequest> pending_;
};

}  // namespace

Result<std::unique_ptr<IoQueue>> make_sync_queue(const QueueOptions& options) {
  if (options.depth == 0) return invalid_argument("I/O queue depth must be > 0");
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return errno_status(StatusCode::kIoError, "eventfd for I/O wake-ups", errno);
  return std::unique_ptr<IoQueue>(std::make_unique<SyncQueue>(options.depth, ScopedFd(efd)));
}

}  // namespace kvtier
