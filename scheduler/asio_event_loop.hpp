// AsioEventLoop: the EventLoop of a serving process — a Boost.Asio io_context run by one dedicated
// thread, with steady_timer timers. See event_loop.hpp for the contract.
//
// Timers live in a map from id to timer, touched only on the loop thread (post_after and
// cancel_timer hop there), so the map needs no lock. The destructor stops the loop after the tasks
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

 private:
  struct Impl;
  explicit AsioEventLoop(std::unique_ptr<Impl> impl);

  SteadyClock clock_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
