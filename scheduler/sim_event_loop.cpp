#include "scheduler/sim_event_loop.hpp"

#include <utility>

namespace kvtier {

void SimEventLoop::post(LoopTask task) {
  std::lock_guard<std::mutex> lock(mu_);
  heap_.push(Event{clock_.now(), next_seq_++, 0, std::move(task)});
}

TimerId SimEventLoop::post_after(Nanos delay, LoopTask task) {
  std::lock_guard<std::mutex> lock(mu_);
  const TimerId id = ++next_timer_;
  heap_.push(Event{clock_.now() + (delay > 0 ? delay : 0), next_seq_++, id, std::move(task)});
  armed_.insert(id);
  return id;
}

bool SimEventLoop::cancel_timer(TimerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only a timer still in the heap: one that fired (a timer's own task may cancel it) or was
  // cancelled already has nothing left to skip, and counting it would make pending() wrap.
  if (armed_.erase(id) == 0) return false;
  cancelled_.insert(id);
  return true;
}

bool SimEventLoop::run_one() {
  Event ev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (true) {
      if (heap_.empty()) return false;
      // priority_queue::top is const; the task is moved out through a const_cast of an element that
      // is popped immediately after, which is the documented way to move from a heap top.
      ev = std::move(const_cast<Event&>(heap_.top()));
      heap_.pop();
      if (ev.id != 0) {
        armed_.erase(ev.id);
        auto it = cancelled_.find(ev.id);
        if (it != cancelled_.end()) {
          cancelled_.erase(it);
          continue;
        }
      }
      break;
    }
  }
  clock_.advance_to(ev.time);
  ev.task();
  if (after_each_event_) after_each_event_();
  return true;
}

uint64_t SimEventLoop::run_until_idle(uint64_t max_events) {
  uint64_t n = 0;
  while (n < max_events && run_one()) ++n;
  return n;
}

uint64_t SimEventLoop::run_until(Nanos t, uint64_t max_events) {
  uint64_t n = 0;
  while (true) {
    const Nanos next = next_event_time();
    if (next < 0 || next > t) break;
    if (n == max_events) return n;
    if (run_one()) ++n;
  }
  clock_.advance_to(t);
  return n;
}

std::size_t SimEventLoop::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heap_.size() - cancelled_.size();
}

Nanos SimEventLoop::next_event_time() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heap_.empty() ? -1 : heap_.top().time;
}

}  // namespace kvtier
