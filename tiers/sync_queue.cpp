// IoQueue without io_uring: requests run with preadv/pwritev on a small pool of threads the queue
// owns, and wait() collects their completions.
//
// The fallback when the kernel or a sandbox refuses io_uring (container runtimes' default seccomp
// profiles do). Requests once ran one at a time on the thread that called wait(): no parallelism
// at the device, and a drive that hung held that thread in a system call, with every other file
// it served and the store's own timeouts (tiers.nvme.io_timeout_ms is checked by that thread
// between waits). Now up to `pool` requests run at once, one per pool thread, and the requests of
// one file hold at most half of the threads, so a hung drive stalls neither the caller nor the
// other drives, and its requests time out as they do over io_uring.
//
// Every contract of IoQueue holds: a prefix of each submit is accepted while fewer than `depth`
// requests are queued or running, one completion per accepted request, short counts reported as
// such, and wake() interrupts wait(). The destructor waits for the requests running (their
// buffers are in use); those not started never run.
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "tiers/io_backend.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

// Threads per queue: enough to keep a drive's queue busy (NVMe wants several requests in flight),
// few enough that a store's queues add little.
constexpr uint32_t kMostThreads = 8;

class SyncQueue final : public IoQueue {
 public:
  SyncQueue(uint32_t depth, std::function<int32_t(const IoRequest&)> call)
      : call_(call ? std::move(call) : run_io_request),
        depth_(depth),
        pool_(std::min(depth, kMostThreads)),
        per_file_(std::max<uint32_t>(1, pool_ / 2)) {}

  ~SyncQueue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status start() {
    try {
      for (uint32_t i = 0; i < pool_; ++i) threads_.emplace_back([this] { run(); });
    } catch (const std::system_error& e) {
      return errno_status(StatusCode::kResourceExhausted, "starting the I/O queue's threads",
                          e.code().value());
    }
    return Status();
  }

  std::string_view kind() const override { return "sync"; }
  uint32_t depth() const override { return depth_; }
  Status register_buffers(std::span<const iovec>) override {
    return unavailable("the synchronous I/O queue has no fixed buffers");
  }

  Result<std::size_t> submit(std::span<const IoRequest> requests) override {
    std::size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const IoRequest& r : requests) {
        if (accepted_ >= depth_) break;
        pending_.push_back(r);
        ++accepted_;
        ++n;
      }
    }
    if (n > 0) work_.notify_all();
    return n;
  }

  Status wait(std::vector<IoCompletion>& out, int timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto ready = [&] { return !done_.empty() || woken_; };
    if (timeout_ms < 0) {
      done_or_woken_.wait(lock, ready);
    } else {
      done_or_woken_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
    }
    woken_ = false;
    out.insert(out.end(), done_.begin(), done_.end());
    accepted_ -= static_cast<uint32_t>(done_.size());
    done_.clear();
    return Status();
  }

  void wake() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
    done_or_woken_.notify_all();
  }

 private:
  // Under mu_: the first pending request whose file holds fewer than per_file_ threads.
  std::deque<IoRequest>::iterator next_runnable() {
    return std::find_if(pending_.begin(), pending_.end(), [&](const IoRequest& r) {
      const auto f = running_.find(r.fd);
      return f == running_.end() || f->second < per_file_;
    });
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = pending_.end();
      work_.wait(lock, [&] { return stopping_ || (it = next_runnable()) != pending_.end(); });
      if (stopping_) return;
      const IoRequest r = *it;
      pending_.erase(it);
      ++running_[r.fd];
      lock.unlock();
      const int32_t result = call_(r);
      lock.lock();
      if (--running_[r.fd] == 0) running_.erase(r.fd);
      done_.push_back(IoCompletion{r.tag, result});
      work_.notify_all();  // a request of that file may run now
      done_or_woken_.notify_all();
    }
  }

  const std::function<int32_t(const IoRequest&)> call_;
  const uint32_t depth_;
  const uint32_t pool_;      // threads
  const uint32_t per_file_;  // most threads one file's requests hold at once
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable work_;               // a request may run, or the queue stops
  std::condition_variable done_or_woken_;      // a completion, or wake()
  std::deque<IoRequest> pending_;              // accepted, not started; guarded by mu_
  std::unordered_map<int, uint32_t> running_;  // per fd: requests running; guarded by mu_
  std::vector<IoCompletion> done_;             // not yet returned by wait(); guarded by mu_
  uint32_t accepted_ = 0;  // pending, running or done but not returned; guarded by mu_
  bool woken_ = false;     // wake() since the last wait(); guarded by mu_
  bool stopping_ = false;  // guarded by mu_
};

}  // namespace

int32_t run_io_request(const IoRequest& r) {
  ssize_t done;
  do {
    done = r.opcode == IoOpcode::kRead
               ? ::preadv(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset))
               : ::pwritev(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset));
  } while (done < 0 && errno == EINTR);
  return done < 0 ? -errno : static_cast<int32_t>(done);
}

Result<std::unique_ptr<IoQueue>> make_sync_queue(const QueueOptions& options) {
  if (options.depth == 0) return invalid_argument("I/O queue depth must be > 0");
  auto q = std::make_unique<SyncQueue>(options.depth, options.sync_call);
  KVTIER_RETURN_IF_ERROR(q->start());
  return std::unique_ptr<IoQueue>(std::move(q));
}

}  // namespace kvtier
