// IoQueue over one io_uring ring (see io_backend.hpp for the contract).
//
// The ring has `depth` request slots plus one for a multishot poll on an eventfd: wake() writes
// the eventfd, the poll completes with tag kWakeTag and a blocked wait() returns. Fixed files are
// not registered (the per-I/O fd lookup is noise next to a block-sized transfer); fixed buffers
// are, when the caller asks and the kernel allows. The CQ is twice the SQ so accepted requests
// (never more than depth) can always post their completions.
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <cerrno>

#include "kvtier/log.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

constexpr uint64_t kWakeTag = 0;

class UringQueue final : public IoQueue {
 public:
  static Result<std::unique_ptr<IoQueue>> create(const QueueOptions& options) {
    if (options.depth == 0) return invalid_argument("io_uring queue depth must be > 0");
    const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) return errno_status(StatusCode::kIoError, "eventfd for io_uring wake-ups", errno);
    auto q = std::unique_ptr<UringQueue>(new UringQueue(options.depth, ScopedFd(efd)));
    const unsigned entries = options.depth + 1;
    io_uring_params params = {};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = 2 * entries;
    bool sqpoll = options.sqpoll;
    if (sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = 1000;  // ms the kernel thread spins before sleeping
    }
    int ret = io_uring_queue_init_params(entries, &q->ring_, &params);
    if (ret < 0 && sqpoll) {
      log_once(LogLevel::kInfo, "nvme.sqpoll",
               "io_uring SQPOLL refused (" + errno_text(-ret) + "); using a plain ring");
      sqpoll = false;
      params = {};
      params.flags = IORING_SETUP_CQSIZE;
      params.cq_entries = 2 * entries;
      ret = io_uring_queue_init_params(entries, &q->ring_, &params);
    }
    if (ret < 0) {
      return errno_status(StatusCode::kUnavailable,
                          "io_uring_queue_init(" + std::to_string(entries) + " entries)", -ret);
    }
    q->initialized_ = true;
    q->sqpoll_ = sqpoll;
    KVTIER_RETURN_IF_ERROR(q->arm_wake());
    ret = io_uring_submit(&q->ring_);
    if (ret < 0) return errno_status(StatusCode::kUnavailable, "io_uring_submit (wake poll)", -ret);
    return std::unique_ptr<IoQueue>(std::move(q));
  }

  ~UringQueue() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  std::string_view kind() const override { return sqpoll_ ? "io_uring+sqpoll" : "io_uring"; }
  uint32_t depth() const override { return depth_; }

  Status register_buffers(std::span<const iovec> buffers) override {
    if (buffers.empty()) return Status();
    const int ret =
        io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
    if (ret < 0) {
      return errno_status(
          StatusCode::kUnavailable,
          "io_uring_register_buffers(" + std::to_string(buffers.size()) + " buffers)", -ret);
    }
    return Status();
  }

  Result<std::size_t> submit(std::span<const IoRequest> requests) override {
    std::size_t n = 0;
    for (const IoRequest& r : requests) {
      if (in_flight_ >= depth_) break;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      prep(sqe, r);
      ++n;
      ++in_flight_;
    }
    // A failed io_uring_enter leaves the prepared SQEs in the ring: they count as accepted and the
    // next wait() submits them again (or reports why it cannot).
    if (n > 0) flush().ignore();
    return n;
  }

  Status wait(std::vector<IoCompletion>& out, int timeout_ms) override {
    const std::size_t before = out.size();
    bool woken = false;
    reap(out, woken);
    if (out.size() > before || woken) return Status();
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts = {};
    if (timeout_ms >= 0) {
      ts.tv_sec = timeout_ms / 1000;
      ts.tv_nsec = static_cast<long long>(timeout_ms % 1000) * 1000000;
    }
    const int ret =
        io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, timeout_ms >= 0 ? &ts : nullptr, nullptr);
    if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      return errno_status(StatusCode::kIoError, "io_uring wait", -ret);
    }
    reap(out, woken);
    return Status();
  }

  void wake() noexcept override {
    const uint64_t one = 1;
    while (::write(wake_fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

 private:
  UringQueue(uint32_t depth, ScopedFd wake_fd) : depth_(depth), wake_fd_(std::move(wake_fd)) {}

  static void prep(io_uring_sqe* sqe, const IoRequest& r) {
    const bool fixed = r.buffer_index >= 0 && r.iovcnt == 1;
    if (r.opcode == IoOpcode::kRead) {
      if (fixed) {
        io_uring_prep_read_fixed(sqe, r.fd, r.iov[0].iov_base,
                                 static_cast<unsigned>(r.iov[0].iov_len), r.offset, r.buffer_index);
      } else {
        io_uring_prep_readv(sqe, r.fd, r.iov, r.iovcnt, r.offset);
      }
    } else {
      if (fixed) {
        io_uring_prep_write_fixed(sqe, r.fd, r.iov[0].iov_base,
                                  static_cast<unsigned>(r.iov[0].iov_len), r.offset,
                                  r.buffer_index);
      } else {
        io_uring_prep_writev(sqe, r.fd, r.iov, r.iovcnt, r.offset);
      }
    }
    io_uring_sqe_set_data64(sqe, r.tag);
  }

  Status arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return internal_error("io_uring: no SQE left for the wake poll");
    io_uring_prep_poll_multishot(sqe, wake_fd_.get(), POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    return Status();
  }

  // Hands prepared SQEs to the kernel. -EBUSY/-EAGAIN leave them in the SQ ring; the next
  // submit_and_wait retries them, so nothing accepted is lost.
  Status flush() {
    const int ret = io_uring_submit(&ring_);
    if (ret < 0 && ret != -EBUSY && ret != -EAGAIN && ret != -EINTR) {
      return errno_status(StatusCode::kIoError, "io_uring_submit", -ret);
    }
    return Status();
  }

  void reap(std::vector<IoCompletion>& out, bool& woken) {
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    bool rearm = false;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        woken = true;
        uint64_t v;
        while (::read(wake_fd_.get(), &v, sizeof(v)) < 0 && errno == EINTR) {
        }
        if ((cqe->flags & IORING_CQE_F_MORE) == 0) rearm = true;
        continue;
      }
      out.push_back(IoCompletion{tag, cqe->res});
      --in_flight_;
    }
    io_uring_cq_advance(&ring_, seen);
    if (rearm && arm_wake().ok()) flush().ignore();
  }

  io_uring ring_ = {};
  bool initialized_ = false;
  bool sqpoll_ = false;
  const uint32_t depth_;
  uint32_t in_flight_ = 0;
  ScopedFd wake_fd_;
};

}  // namespace

Result<std::unique_ptr<IoQueue>> make_uring_queue(const QueueOptions& options) {
  return UringQueue::create(options);
}

}  // namespace kvtier
