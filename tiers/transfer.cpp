#include "tiers/transfer.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "kvtier/log.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {
std::atomic<uint64_t> g_next_transfer_id{1};
}  // namespace

Result<std::shared_ptr<CompletionNotifier>> CompletionNotifier::create() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return errno_status(StatusCode::kIoError, "eventfd for transfer completions", errno);
  return std::shared_ptr<CompletionNotifier>(new CompletionNotifier(ScopedFd(fd)));
}

void CompletionNotifier::notify() noexcept {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: the loop is already due to wake.
  while (::write(fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

uint64_t CompletionNotifier::drain() noexcept {
  uint64_t value = 0;
  while (::read(fd_.get(), &value, sizeof(value)) < 0) {
    if (errno != EINTR) return 0;
  }
  return value;
}

TransferState::TransferState(Link link, uint64_t bytes, TransferOptions options,
                             std::shared_ptr<TransferStats> stats,
                             std::shared_ptr<CompletionNotifier> notifier)
    : id_(g_next_transfer_id.fetch_add(1, std::memory_order_relaxed)),
      link_(link),
      bytes_(bytes),
      options_(std::move(options)),
      stats_(std::move(stats)),
      notifier_(std::move(notifier)),
      start_(std::chrono::steady_clock::now()) {}

void TransferState::part_done(const Status& status) noexcept {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (part_code_ == StatusCode::kOk) {
      part_code_ = status.code();
      part_message_ = status.message();
    }
  }
  if (parts_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  StatusCode code;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    code = part_code_;
    message = part_message_;
  }
  complete(code == StatusCode::kOk ? Status() : Status(code, std::move(message)));
}

void TransferState::complete(const Status& status) noexcept {
  if (completing_.exchange(true, std::memory_order_acq_rel)) {
    log(LogLevel::kError, "transfer " + std::to_string(id_) + " completed twice; ignored");
    status.ignore();
    return;
  }
  const StatusCode code = status.code();
  if (stats_) {
    LinkStats& ls = stats_->link(link_);
    if (code == StatusCode::kOk) {
      ls.bytes.fetch_add(bytes_, std::memory_order_relaxed);
      ls.ops.fetch_add(1, std::memory_order_relaxed);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
      ls.latency.record(static_cast<uint64_t>(ns < 0 ? 0 : ns));
    } else if (code == StatusCode::kCancelled) {
      ls.cancelled.fetch_add(1, std::memory_order_relaxed);
    } else {
      ls.errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    code_ = code;
    message_ = status.message();
  }
  if (options_.on_complete) {
    // The callback sees its own copy, so it may keep or move it freely.
    const Status copy = code == StatusCode::kOk ? Status() : Status(code, status.message());
    options_.on_complete(copy);
    copy.ignore();
  }
  if (!buffers_held_.load(std::memory_order_relaxed)) release_buffers();
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  if (notifier_) notifier_->notify();
}

void TransferState::release_buffers() noexcept {
  if (buffers_released_.exchange(true, std::memory_order_acq_rel)) {
    log(LogLevel::kError,
        "transfer " + std::to_string(id_) + " released its buffers twice; ignored");
    return;
  }
  if (!options_.on_buffers_released) return;
  Status outcome;  // recorded before on_complete ran
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (code_ != StatusCode::kOk) outcome = Status(code_, message_);
  }
  options_.on_buffers_released(outcome);
  outcome.ignore();
}

void TransferState::set_device_event(void* event, std::shared_ptr<void> keepalive) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_event_ = event;
    event_keepalive_ = std::move(keepalive);
  }
  cv_.notify_all();
}

void* TransferState::device_event() const {
  if (!expects_event_.load(std::memory_order_relaxed)) return nullptr;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock,
           [this] { return device_event_ != nullptr || done_.load(std::memory_order_relaxed); });
  return device_event_;
}

Status TransferState::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed)) {
    return failed_precondition("transfer " + std::to_string(id_) + " has not completed");
  }
  if (code_ == StatusCode::kOk) return Status();
  return Status(code_, message_);
}

Status TransferState::wait() const {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_relaxed); });
  }
  return result();
}

bool TransferState::wait_for(std::chrono::nanoseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return done_.load(std::memory_order_relaxed); });
}

Transfer& Transfer::operator=(Transfer&& other) noexcept {
  if (this != &other) {
    if (state_) state_->wait().ignore();
    state_ = std::move(other.state_);
  }
  return *this;
}

Transfer::~Transfer() {
  if (state_) state_->wait().ignore();
}

Status Transfer::wait() const {
  if (!state_) return Status();
  return state_->wait();
}

Status Transfer::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) return Status();
  if (!state_->wait_for(timeout)) {
    return deadline_exceeded("transfer " + std::to_string(state_->id()) + " (" +
                             std::string(link_name(state_->link())) + ", " +
                             std::to_string(state_->bytes()) + " bytes) not done after " +
                             std::to_string(timeout.count() / 1000) + " us");
  }
  return state_->result();
}

void Transfer::cancel() {
  if (state_) state_->request_cancel();
}

}  // namespace kvtier
