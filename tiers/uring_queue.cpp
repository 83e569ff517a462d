// IoQueue over one io_uring ring (see io_backend.hpp for the contract).
//
// The ring has `depth` request slots plus one for a poll on an eventfd: wake() writes the eventfd,
// the poll completes with tag kWakeTag, the eventfd is drained and a blocked wait() returns. Fixed
// files are not registered (the per-I/O fd lookup is noise next to a block-sized transfer); fixed
// buffers are, when the caller asks and the kernel allows. The CQ is twice the SQ so accepted
// requests (never more than depth) can always post their completions.
//
// The wake poll is multishot (IORING_POLL_ADD_MULTI, Linux >= 5.13): armed once, it posts a CQE
// with IORING_CQE_F_MORE per wake. Older kernels complete that request at once with -EINVAL; the
// queue then switches, for good and with one log line, to one-shot polls (IORING_OP_POLL_ADD)
// re-armed after each wake. Either kind may end: a one-shot poll after its wake, a multishot one
// when the kernel terminates it (a CQE without F_MORE, e.g. when the CQ overflowed). Any ended poll
// is re-armed once the CQ is reaped — at once, or on the next submit()/wait() if the SQ had no
// entry free — so a wake is never lost, and an error completion is never taken for a wake (that
// would turn the I/O thread's blocking wait into a spin). Should even one-shot polls be refused
// (no sane kernel does), wait() stops polling and caps each sleep at kNapMs, logged once: wake()
// is then late by at most that, never lost. Rejected: probing for multishot support up front —
// the kernel reports it only through this completion (it is a flag, not an opcode), and the same
// handling is needed anyway for a multishot poll that ends.
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
constexpr int kNapMs = 10;  // longest sleep in wait() when the eventfd cannot be polled
// A poll flag no kernel defines (WakePoll::kRefusedMultishot): the request fails with -EINVAL.
constexpr unsigned kUnknownPollFlag = 1u << 31;

class UringQueue final : public IoQueue {
 public:
  static Result<std::unique_ptr<IoQueue>> create(const QueueOptions& options) {
    if (options.depth == 0) return invalid_argument("io_uring queue depth must be > 0");
    const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) return errno_status(StatusCode::kIoError, "eventfd for io_uring wake-ups", errno);
    auto q = std::unique_ptr<UringQueue>(
        new UringQueue(options.depth, options.wake_poll, ScopedFd(efd)));
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
    if (!q->arm_wake()) return internal_error("io_uring: no SQE left for the wake poll");
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
    const bool rearmed = arm_wake_if_ended();
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
    if (n > 0 || rearmed) flush().ignore();
    return n;
  }

  Status wait(std::vector<IoCompletion>& out, int timeout_ms) override {
    const std::size_t before = out.size();
    bool woken = false;
    reap(out, woken);
    if (out.size() > before || woken) return Status();
    arm_wake_if_ended();  // submitted by the wait below
    if (!polling_ && (timeout_ms < 0 || timeout_ms > kNapMs)) timeout_ms = kNapMs;
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

  UringWakeState wake_state() const { return UringWakeState{multishot_, polling_, wake_arms_}; }

 private:
  UringQueue(uint32_t depth, WakePoll wake_poll, ScopedFd wake_fd)
      : depth_(depth),
        wake_poll_(wake_poll),
        multishot_(wake_poll != WakePoll::kOneShot),
        wake_fd_(std::move(wake_fd)) {}

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

  // Prepares the wake poll; false when the SQ has no entry free (the caller retries later).
  bool arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return false;
    if (multishot_) {
      io_uring_prep_poll_multishot(sqe, wake_fd_.get(), POLLIN);
      if (wake_poll_ == WakePoll::kRefusedMultishot) sqe->len |= kUnknownPollFlag;
    } else {
      io_uring_prep_poll_add(sqe, wake_fd_.get(), POLLIN);
    }
    io_uring_sqe_set_data64(sqe, kWakeTag);
    wake_armed_ = true;
    ++wake_arms_;
    return true;
  }

  // Re-arms a wake poll that has ended; true when an SQE was prepared (not yet submitted).
  bool arm_wake_if_ended() { return !wake_armed_ && polling_ && arm_wake(); }

  // One completion of the wake poll; true when it reports a wake (the eventfd is drained).
  bool on_wake_cqe(const io_uring_cqe& cqe) {
    if ((cqe.flags & IORING_CQE_F_MORE) == 0) wake_armed_ = false;  // that poll is over
    if (cqe.res >= 0) {
      uint64_t v;
      while (::read(wake_fd_.get(), &v, sizeof(v)) < 0 && errno == EINTR) {
      }
      return true;
    }
    if (cqe.res == -ECANCELED || cqe.res == -EINTR || cqe.res == -EAGAIN) return false;
    if (multishot_) {  // -EINVAL before Linux 5.13
      multishot_ = false;
      log_once(LogLevel::kInfo, "nvme.io_uring.multishot",
               "io_uring multishot poll refused (" + errno_text(-cqe.res) +
                   "; Linux >= 5.13 has it); I/O thread wake-ups use one-shot polls");
      return false;
    }
    polling_ = false;
    log_once(LogLevel::kWarn, "nvme.io_uring.wake_poll",
             "io_uring poll on the wake-up eventfd refused (" + errno_text(-cqe.res) +
                 "); I/O threads look for work at least every " + std::to_string(kNapMs) +
                 " ms instead");
    return false;
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
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        if (on_wake_cqe(*cqe)) woken = true;
        continue;
      }
      out.push_back(IoCompletion{tag, cqe->res});
      --in_flight_;
    }
    io_uring_cq_advance(&ring_, seen);
    if (arm_wake_if_ended()) flush().ignore();
  }

  io_uring ring_ = {};
  bool initialized_ = false;
  bool sqpoll_ = false;
  const uint32_t depth_;
  const WakePoll wake_poll_;
  uint32_t in_flight_ = 0;
  bool multishot_;           // the kind of wake poll armed from now on
  bool wake_armed_ = false;  // a wake poll is in the ring (prepared, submitted or pending)
  bool polling_ = true;      // false: the kernel refuses to poll the eventfd at all
  uint64_t wake_arms_ = 0;
  ScopedFd wake_fd_;
};

}  // namespace

Result<std::unique_ptr<IoQueue>> make_uring_queue(const QueueOptions& options) {
  return UringQueue::create(options);
}

Result<UringWakeState> uring_wake_state(const IoQueue& queue) {
  const auto* q = dynamic_cast<const UringQueue*>(&queue);
  if (q == nullptr) {
    return invalid_argument("uring_wake_state: a \"" + std::string(queue.kind()) +
                            "\" queue is not an io_uring queue");
  }
  return q->wake_state();
}

}  // namespace kvtier
