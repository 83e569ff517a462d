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
// it); it has a deadline, so a stuck loop becomes kDeadlineExceeded, never a hang. "On the loop"
// means holding the loop's turn: tasks run one at a time, in post order, and a task may run on the
// caller's own thread when nothing is queued before it (AsioEventLoop), which spares an engine
// call two thread wake-ups.
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
  // True inside a loop task, whichever thread runs it (SimEventLoop: always, it runs on its
  // caller's thread).
  virtual bool in_loop() const = 0;

  // Runs `fn` on the loop, after every task posted before the call, and returns its Status,
  // waiting at most `timeout` (wall time) for the loop to start it. Inside a loop task it runs
  // inline. When the loop has not started `fn` in time the call returns kDeadlineExceeded and `fn`
  // never runs; once started, it runs to the end and the caller gets its result (loop tasks never
  // block, so that wait is short). Either way the caller knows exactly whether `fn` took effect.
  // A `fn` that throws is a bug in kvtier; AsioEventLoop gives the caller kInternal and keeps
  // running (SimEventLoop lets it propagate to the test or benchmark that drives it).
  virtual Status run_sync(std::function<Status()> fn, Nanos timeout) = 0;
};

}  // namespace kvtier
