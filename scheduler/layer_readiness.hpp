// LayerReadiness: the CPU-side readiness event of one layer of one step.
//
// The scheduler's loop counts the page loads a layer still waits for (`add_pending` when it plans a
// load, `page_arrived` / `page_failed` as loads complete, `seal` once every page of the layer is
// planned); engine threads block in `wait` until the layer is ready, failed or the deadline passes.
// A failed page makes the layer fail (the engine then recomputes or aborts that sequence): it is
// never reported ready, so a kernel never reads bytes that did not arrive. Thread-safe; waiting
// never touches the loop. On a GPU the engine would additionally order its stream after the copy
// engine's event; the CPU wait here is the conservative form of that wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier/status.hpp"
#include "scheduler/clock.hpp"

namespace kvtier {

class LayerReadiness {
 public:
  // Loop side.
  void add_pending(uint32_t pages = 1);
  void page_arrived();
  void page_failed(const Status& why);
  // The layer fails as a whole, whatever its pages do (the step can no longer be served).
  void fail(const Status& why);
  // No more pages will be added; the layer is ready once the pending ones arrive.
  void seal();
  // Runs `fn` on the loop once the layer is ready or failed (at once if it already is). This is how
  // a simulated engine, which shares the loop's thread and cannot block, learns of readiness.
  void on_done(std::function<void()> fn);

  // Engine side. OK when ready; the first load error when a page failed; kDeadlineExceeded when
  // `timeout` passes first. `waited` receives the time spent blocked.
  Status wait(Nanos timeout, Nanos* waited = nullptr) const;
  bool ready() const;
  // Ready or failed: waiting longer changes nothing.
  bool finished() const;
  bool sealed() const;

 private:
  void fire_if_done();                     // loop side, without mu_ held
  void record_failure(const Status& why);  // with mu_ held

  mutable std::mutex mu_;
  std::vector<std::function<void()>> on_done_;
  mutable std::condition_variable cv_;
  uint32_t pending_ = 0;
  bool sealed_ = false;
  bool failed_ = false;
  StatusCode fail_code_ = StatusCode::kOk;
  std::string fail_message_;
};

}  // namespace kvtier
