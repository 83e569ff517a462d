// SimEventLoop: a discrete-event EventLoop in virtual time (see event_loop.hpp).
//
// Events sit in a min-heap ordered by (time, post sequence); run_*() pops them one by one, moves
// the VirtualClock to each event's time and runs it. post() is an event at the current time.
// Nothing runs concurrently and nothing depends on wall time, so a simulation is exactly
// repeatable. The loop is driven by its caller's thread (in_loop() is always true); post() from
// another thread is allowed (a mutex guards the heap) but a simulation normally has only one
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <unordered_set>
#include <utility>
#include <vector>

#include "scheduler/event_loop.hpp"

namespace kvtier {

class SimEventLoop final : public EventLoop {
 public:
  const Clock& clock() const override { return clock_; }
  void post(LoopTask task) override;
  TimerId post_after(Nanos delay, LoopTask task) override;
  bool cancel_timer(TimerId id) override;
  bool in_loop() const override { return true; }
  // Runs inline: the simulation's caller is the loop.
  Status run_sync(std::function<Status()> fn, Nanos timeout) override { return fn(); }

  // Runs the next event; false when there is none.
  bool run_one();
  // Runs events until none is left, or `max_events` have run (a bound on a livelock: events that
  // keep posting each other); returns how many ran.
  uint64_t run_until_idle(uint64_t max_events = UINT64_MAX);
  // Runs every event due at or before `t`, then moves the clock to `t`; returns how many ran. At
  // most `max_events`: then the clock stays at the last event's time.
  uint64_t run_until(Nanos t, uint64_t max_events = UINT64_MAX);
  // Runs events until `done()` holds, none is left or `max_events` have run; true when done()
  // holds.
  template <typename Pred>
  bool run_while_not(Pred done, uint64_t max_events = UINT64_MAX) {
    for (uint64_t n = 0; !done(); ++n) {
      if (n == max_events || !run_one()) return done();
    }
    return true;
  }
  std::size_t pending() const;
  // Time of the next event, or -1 when none.
  Nanos next_event_time() const;
  // Calls `fn` after every event run_*() runs, on the caller's thread (an empty function: none).
  // Tests check invariants there: in the runtime an engine thread may see the state between any
  // two of the loop's tasks, not only when the loop is idle.
  void after_each_event(std::function<void()> fn) { after_each_event_ = std::move(fn); }

 private:
  struct Event {
    Nanos time;
    uint64_t seq;
    TimerId id;  // 0 for plain posts
    LoopTask task;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };

  VirtualClock clock_;
  mutable std::mutex mu_;
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  std::unordered_set<TimerId> armed_;      // timers in the heap, not cancelled
  std::unordered_set<TimerId> cancelled_;  // cancelled timers still in the heap
  uint64_t next_seq_ = 0;
  TimerId next_timer_ = 0;
  std::function<void()> after_each_event_;
};

}  // namespace kvtier
