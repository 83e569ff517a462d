// Transfer: the handle of one asynchronous copy between tiers, and the completion plumbing behind
// it.
//
// Life of a transfer: an engine (copy engine, NVMe store) validates the request synchronously —
// argument errors, an unknown key, no free extent come back as the Status of the submit call and
// nothing runs — then returns a Transfer. The work runs on the engine's threads; exactly once, the
// engine calls TransferState::complete(status). complete() records the link counters, runs the
// optional callback, wakes waiters and finally signals the CompletionNotifier's eventfd, in that
// order: when wait() returns or the eventfd fires, the callback has already run.
//
// Who runs callbacks: the engine thread that completed the transfer (a copy worker, a CUDA
// completion thread, an io_uring thread). Callbacks must be short, must not block on another
// transfer of the same engine, and must not wait on their own transfer; a scheduler posts them to
// its event loop or just watches the eventfd and polls its handles.
//
// Cancel: cancel() asks. A transfer that has not started (still queued in its engine) completes
// with kCancelled and moves no bytes; one that has started runs to completion, because its buffers
// are in use by the kernel or the GPU. Either way it completes exactly once, and the final Status
// says which.
//
// Buffers held past completion: a transfer normally completes once its engine is done with its
// buffers. An NVMe request the drive leaves unanswered past tiers.nvme.io_timeout_ms cannot be
// taken back, yet its caller must not wait for a hung drive. A caller that sets
// on_buffers_released accepts that: such a request then completes at its timeout (an error), and
// on_buffers_released runs once the drive has answered, when the buffers are the caller's again.
// For every other transfer that sets it, it runs right after on_complete. Either way it runs
// exactly once, on the engine thread, after on_complete, given the same final Status. A read
// without it completes only when its buffers are free (past its timeout it waits for the drive); a
// write past its timeout completes then anyway, its pages still mapped for the drive to read
// (nvme_store.hpp).
//
// A Transfer is move-only. Its destructor waits for the transfer (the buffers it names must stay
// valid until then); `detach()` gives that up for fire-and-forget use with a callback — the engine
// keeps the state alive until completion. Thread-safety: a handle is used by one thread at a time;
// the state behind it is shared with the engine and is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kvtier/status.hpp"
#include "kvtier/transfer_stats.hpp"
#include "tiers/scoped_fd.hpp"

namespace kvtier {

using TransferCallback = std::function<void(const Status&)>;

struct TransferOptions {
  // Runs once on the completing engine thread (see above). May be empty.
  TransferCallback on_complete;
  // CUDA copies only: an event (cudaEvent_t) the copy waits on before it starts, e.g. the compute
  // stream's "K/V written" event. Ignored by emulated copies and NVMe I/O.
  void* wait_device_event = nullptr;
  // Runs once the engine no longer touches the transfer's buffers (see "Buffers held past
  // completion" above), given the transfer's final Status. Setting it lets the engine complete a
  // hung request before then.
  TransferCallback on_buffers_released;
};

// An eventfd that becomes readable when any transfer of an engine completes. The scheduler's loop
// watches fd(); drain() resets it. Thread-safe.
class CompletionNotifier {
 public:
  static Result<std::shared_ptr<CompletionNotifier>> create();

  int fd() const { return fd_.get(); }
  void notify() noexcept;
  // Reads and returns the number of notifications since the last drain (0 when none).
  uint64_t drain() noexcept;

 private:
  explicit CompletionNotifier(ScopedFd fd) : fd_(std::move(fd)) {}
  ScopedFd fd_;
};

class TransferState {
 public:
  TransferState(Link link, uint64_t bytes, TransferOptions options,
                std::shared_ptr<TransferStats> stats, std::shared_ptr<CompletionNotifier> notifier);
  TransferState(const TransferState&) = delete;
  TransferState& operator=(const TransferState&) = delete;

  uint64_t id() const { return id_; }
  Link link() const { return link_; }
  uint64_t bytes() const { return bytes_; }
  const TransferOptions& options() const { return options_; }

  // Multi-part transfers: set once before the parts run; each part reports with part_done, and the
  // last one completes the transfer with the first error (or OK).
  void set_parts(uint32_t parts) { parts_.store(parts, std::memory_order_relaxed); }
  void part_done(const Status& status) noexcept;

  // Exactly once. A second call is a bug in the engine; it is logged and ignored.
  void complete(const Status& status) noexcept;

  // Engine side of "Buffers held past completion": before complete(), hold_buffers() says the
  // buffers stay in use after it, and the engine calls release_buffers() once they are free;
  // otherwise complete() releases them itself. may_hold_buffers(): whether the caller accepts a
  // read completed before then (it set on_buffers_released).
  bool may_hold_buffers() const { return static_cast<bool>(options_.on_buffers_released); }
  void hold_buffers() { buffers_held_.store(true, std::memory_order_relaxed); }
  void release_buffers() noexcept;

  bool done() const { return done_.load(std::memory_order_acquire); }
  Status result() const;  // precondition: done()
  Status wait() const;
  bool wait_for(std::chrono::nanoseconds timeout) const;

  void request_cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_.load(std::memory_order_relaxed); }

  // CUDA copies: the engine marks the transfer at submit, then publishes the event it recorded
  // after the copy (cudaEvent_t) once the copy is enqueued; `keepalive` owns the event for as long
  // as this state lives, so a handle's event is never destroyed under the caller.
  void expect_device_event() { expects_event_.store(true, std::memory_order_relaxed); }
  void set_device_event(void* event, std::shared_ptr<void> keepalive);
  // The event, waiting (microseconds) until the copy is enqueued; nullptr for transfers that have
  // none (emulated, NVMe) or that ended before being enqueued (cancelled, failed).
  void* device_event() const;

 private:
  const uint64_t id_;
  const Link link_;
  const uint64_t bytes_;
  const TransferOptions options_;
  const std::shared_ptr<TransferStats> stats_;
  const std::shared_ptr<CompletionNotifier> notifier_;
  const std::chrono::steady_clock::time_point start_;

  std::atomic<bool> cancel_{false};
  std::atomic<bool> completing_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> expects_event_{false};
  std::atomic<bool> buffers_held_{false};
  std::atomic<bool> buffers_released_{false};
  void* device_event_ = nullptr;           // guarded by mu_
  std::shared_ptr<void> event_keepalive_;  // guarded by mu_
  std::atomic<uint32_t> parts_{1};

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // The outcome, stored as plain fields (not a Status) so concurrent readers never write to it.
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  // First error among parts.
  StatusCode part_code_ = StatusCode::kOk;
  std::string part_message_;
};

class Transfer {
 public:
  Transfer() = default;
  explicit Transfer(std::shared_ptr<TransferState> state) : state_(std::move(state)) {}
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  Transfer(Transfer&&) noexcept = default;
  Transfer& operator=(Transfer&& other) noexcept;
  ~Transfer();

  bool valid() const { return state_ != nullptr; }
  uint64_t id() const { return state_ ? state_->id() : 0; }
  // Non-blocking poll. An empty handle is done.
  bool done() const { return !state_ || state_->done(); }
  // Blocks until completion; the transfer's final Status. An empty handle is OK.
  Status wait() const;
  // kDeadlineExceeded when not done within `timeout` (the transfer keeps running).
  Status wait_for(std::chrono::nanoseconds timeout) const;
  void cancel();
  void detach() { state_.reset(); }
  void* device_event() const { return state_ ? state_->device_event() : nullptr; }

 private:
  std::shared_ptr<TransferState> state_;
};

}  // namespace kvtier
