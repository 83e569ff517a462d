// The gate between a Python kvtier.Runtime's calls and its shutdown, which may be refused.
//
// A call holds `mu` shared for as long as it runs; a shutdown holds it exclusively, so it waits
// only for the calls in progress. glibc's rwlock prefers readers, so a stream of calls on other
// threads could keep a waiting shutdown out for good: a shutdown first says it is deciding, and a
// call that finds one deciding does not take `mu` but waits for the decision. A refused shutdown
// (a NumPy view of the arena made while it waited) leaves the runtime open, and the calls that
// waited go ahead: no call fails as shut down while the runtime is not. A shutdown that goes
// through marks the gate shut before it stops the runtime, and every call fails from then on.
//
// A call made inside another call of the same gate on one thread (a destructor run by the garbage
// collector in the middle of a call) must not wait for a decision that waits for that thread: it
// is let in at once, as the reader-preferring lock allows, and no shutdown can go through
// meanwhile.
//
// Every blocking wait of a call runs inside `wait_with(fn)`, which the module uses to release the
// GIL (and to re-take it only after the lock is released again), so no Python thread stalls behind
// a shutdown. Header-only, free of Python, and tested on its own
// (tests/runtime/call_gate_test.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace kvtier::python {

class CallGate {
 public:
  // One admitted call: the lock held shared. Movable, never shared between threads.
  class Call {
   public:
    Call(Call&& other) noexcept
        : gate_(std::exchange(other.gate_, nullptr)), lock_(std::move(other.lock_)) {}
    Call& operator=(Call&&) = delete;
    Call(const Call&) = delete;
    ~Call() {
      if (gate_ == nullptr) return;
      auto& held = held_here();
      auto last = std::find(held.rbegin(), held.rend(), gate_);
      if (last != held.rend()) held.erase(std::next(last).base());
    }

   private:
    friend class CallGate;
    Call(const CallGate* gate, std::shared_lock<std::shared_mutex> lock)
        : gate_(gate), lock_(std::move(lock)) {
      held_here().push_back(gate_);
    }
    const CallGate* gate_;
    std::shared_lock<std::shared_mutex> lock_;
  };

  // One shutdown deciding, with `mu` held exclusively from its construction: either commit() (the
  // gate is shut for good; `mu` stays held until this ends, while the runtime stops) or let it end
  // uncommitted (refused: the runtime stays open). Waiting calls are told either way.
  class Closing {
   public:
    explicit Closing(CallGate& gate) : gate_(gate) {
      gate_.deciding_.fetch_add(1, std::memory_order_acq_rel);
      lock_ = std::unique_lock(gate_.mu_);
    }
    Closing(const Closing&) = delete;
    Closing& operator=(const Closing&) = delete;
    ~Closing() {
      if (!decided_) decide();
    }
    // An earlier shutdown went through: nothing is left to decide.
    bool already_shut() const { return gate_.shut_.load(std::memory_order_acquire); }
    void commit() {
      gate_.shut_.store(true, std::memory_order_release);
      decide();
    }

   private:
    void decide() {
      decided_ = true;
      gate_.deciding_.fetch_sub(1, std::memory_order_acq_rel);
      gate_.deciding_.notify_all();
    }
    CallGate& gate_;
    std::unique_lock<std::shared_mutex> lock_;
    bool decided_ = false;
  };

  CallGate() = default;
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // Admits one call, or nullopt once a shutdown went through. Waits out a shutdown that is
  // deciding; each wait runs as wait_with(fn).
  template <typename WaitWith>
  std::optional<Call> enter(WaitWith&& wait_with) {
    if (held_by_this_thread()) {
      // Inside a call of this gate: a shutdown deciding waits for this thread, and cannot go
      // through before it leaves. The lock prefers readers, so this takes it at once.
      return Call(this, std::shared_lock(mu_));
    }
    for (;;) {
      if (shut_.load(std::memory_order_acquire)) return std::nullopt;
      const uint32_t deciding = deciding_.load(std::memory_order_acquire);
      if (deciding != 0) {
        wait_with([&] { deciding_.wait(deciding, std::memory_order_acquire); });
        continue;
      }
      std::shared_lock lock(mu_, std::try_to_lock);
      if (!lock.owns_lock()) {
        // Held exclusively by a shutdown: one raised since `deciding_` was read (the loop waits
        // for its decision), one that went through (the loop fails), or one refused that is
        // letting `mu` go (waited for here).
        if (!shut_.load(std::memory_order_acquire) &&
            deciding_.load(std::memory_order_acquire) == 0) {
          wait_with([&] { std::shared_lock wait(mu_); });
        }
        continue;
      }
      if (shut_.load(std::memory_order_acquire)) return std::nullopt;
      return Call(this, std::move(lock));
    }
  }

  bool shut_down() const { return shut_.load(std::memory_order_acquire); }
  bool deciding() const { return deciding_.load(std::memory_order_acquire) != 0; }

 private:
  static std::vector<const CallGate*>& held_here() {
    thread_local std::vector<const CallGate*> held;
    return held;
  }
  bool held_by_this_thread() const {
    const auto& held = held_here();
    return std::find(held.begin(), held.end(), this) != held.end();
  }

  std::shared_mutex mu_;
  std::atomic<uint32_t> deciding_{0};  // shutdowns raised and not yet decided
  std::atomic<bool> shut_{false};      // a shutdown went through
};

}  // namespace kvtier::python
