#include "scheduler/layer_readiness.hpp"

#include <chrono>

namespace kvtier {

void LayerReadiness::add_pending(uint32_t pages) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_ += pages;
}

void LayerReadiness::page_arrived() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_ > 0) --pending_;
    wake = pending_ == 0 && sealed_;
  }
  if (wake) cv_.notify_all();
  fire_if_done();
}

void LayerReadiness::page_failed(const Status& why) {
  {
    // One critical section: a waiter must never see the last page counted and the layer not
    // failed (it would read bytes that did not arrive).
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_ > 0) --pending_;
    record_failure(why);
  }
  cv_.notify_all();
  fire_if_done();
}

void LayerReadiness::fail(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    record_failure(why);
  }
  cv_.notify_all();
  fire_if_done();
}

void LayerReadiness::record_failure(const Status& why) {
  if (failed_) return;  // the first error is the one reported
  failed_ = true;
  fail_code_ = why.code();
  fail_message_ = why.message();
}

void LayerReadiness::seal() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sealed_ = true;
  }
  cv_.notify_all();
  fire_if_done();
}

void LayerReadiness::on_done(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_done_.push_back(std::move(fn));
  }
  fire_if_done();
}

void LayerReadiness::fire_if_done() {
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!(failed_ || (sealed_ && pending_ == 0))) return;
    fns.swap(on_done_);
  }
  for (auto& fn : fns) fn();
}

bool LayerReadiness::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sealed_ && pending_ == 0 && !failed_;
}

bool LayerReadiness::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_ || (sealed_ && pending_ == 0);
}

bool LayerReadiness::sealed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sealed_;
}

Status LayerReadiness::wait(Nanos timeout, Nanos* waited) const {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = cv_.wait_for(lock, std::chrono::nanoseconds(timeout),
                                 [&] { return failed_ || (sealed_ && pending_ == 0); });
  if (waited != nullptr) {
    *waited = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
  }
  if (failed_) return Status(fail_code_, fail_message_);
  if (!done) {
    return deadline_exceeded("layer not ready after " + std::to_string(timeout / kNanosPerMilli) +
                             " ms (" + std::to_string(pending_) + " page loads outstanding)");
  }
  return ok_status();
}

}  // namespace kvtier
