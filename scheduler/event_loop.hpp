// EventLoop: the one thread that owns the scheduler's decisions.
//
// Every change to scheduler state (plans, eviction, the bookkeeping of transfers) runs as a task on
// the loop, one at a time, so the scheduler and its policies need no locks of their own. Other
// threads hand work to the loop with post(); transfer engines post their completions the same way.
// Two implementations share this interface:
//   - AsioEventLoop: a Boost.Asio io_context on a dedicated thread, wall-clock timers. post() from
//     another thread wakes the loop through the reactor's eventfd.
//   - SimEventLoop: a discrete-event loop in virtual time, run by the caller's thread; time jumps
//   to
//     the next event, ties in post order, so a run is deterministic.
// run_sync() is the one way a caller waits on the loop (the step contract's begin/end calls use
// it); it has a deadline, so a stuck loop becomes kDeadlineExceeded, never a hang.
#pragma once

#include <cstdint>
#include <functional>

#include "kvtier/status.hpp"
#include "scheduler/clock.hpp"

namespace kvtier {

using LoopTask = std::function<void()>;
using TimerId = uint64_t;

class EventLoop {
 public:
  virtual ~EventLoop() = default;

  virtual const Clock& clock() const = 0;
  Nanos now() const { return clock().now(); }

  // Runs `task` on the loop soon, after tasks posted before it. Thread-safe.
  virtual void post(LoopTask task) = 0;
  // Runs `task` on the loop once `delay` has passed. Thread-safe. The id cancels it.
  virtual TimerId post_after(Nanos delay, LoopTask task) = 0;
  // Cancels a timer that has not fired; false when it already ran or never existed. Thread-safe.
  virtual bool cancel_timer(TimerId id) = 0;
  // True on the loop's own thread (SimEventLoop: always, it runs on its caller's thread).
  virtual bool in_loop() const = 0;

  // Runs `fn` on the loop and returns its Status, waiting at most `timeout` (wall time) for the
  // loop to start it. On the loop itself it runs inline. When the loop has not started `fn` in time
  // the call returns kDeadlineExceeded and `fn` never runs; once started, it runs to the end and
  // the caller gets its result (loop tasks never block, so that wait is short). Either way the
  // caller knows exactly whether `fn` took effect.
  virtual Status run_sync(std::function<Status()> fn, Nanos timeout) = 0;
};

}  // namespace kvtier
