// AsioEventLoop: the EventLoop of a serving process — a Boost.Asio io_context run by one dedicated
// thread, with steady_timer timers. See event_loop.hpp for the contract.
//
// The turn. Whoever runs a loop task holds the loop's turn (a flag): the loop thread around each
// task and timer handler it runs, or a caller of run_sync that found the loop idle. That caller
// runs its task on its own thread: it takes the turn without waiting and finds no task queued
// (a count of posted tasks not yet run, decremented under the turn), so running now is running in
// post order. Otherwise run_sync posts the task and waits, as a hand-off to the loop thread costs
// two thread wake-ups (tens of microseconds) where the turn costs an atomic exchange. A task thus
// sees every earlier task's effects through the turn (acquire/release), whichever thread ran it.
//
// Timers live in a map from id to timer, touched only inside loop tasks (post_after and
// cancel_timer hop there), so the turn guards it. The destructor stops the loop after the tasks
// already posted have run, then joins the thread; tasks posted after that are dropped.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "scheduler/event_loop.hpp"

namespace kvtier {

class AsioEventLoop final : public EventLoop {
 public:
  static Result<std::unique_ptr<AsioEventLoop>> create();
  ~AsioEventLoop() override;

  const Clock& clock() const override { return clock_; }
  void post(LoopTask task) override;
  TimerId post_after(Nanos delay, LoopTask task) override;
  bool cancel_timer(TimerId id) override;
  bool in_loop() const override;
  Status run_sync(std::function<Status()> fn, Nanos timeout) override;
  // run_sync, always handed to the loop's own thread (inline inside a loop task): for a task its
  // caller's thread should not run, such as one that takes every page-table shard lock while the
  // caller holds locks of its own, and for measuring what the hand-off costs.
  Status run_on_loop_thread(std::function<Status()> fn, Nanos timeout);

 private:
  // Posts `fn` and waits for the loop's thread to run it (run_sync's contract).
  Status hand_off(std::function<Status()> fn, Nanos timeout);

  struct Impl;
  explicit AsioEventLoop(std::unique_ptr<Impl> impl);

  SteadyClock clock_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
