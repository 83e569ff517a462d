// Clock: where the scheduler reads time.
//
// The scheduler never calls std::chrono directly, so the same decisions run against wall time
// (SteadyClock, serving an engine) or against the virtual time of a discrete-event model
// (VirtualClock, advanced only by SimEventLoop as events fire: deterministic, and an hour of
// modeled traffic runs in minutes). Times are nanoseconds since an arbitrary epoch, as int64.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier {

using Nanos = int64_t;

constexpr Nanos kNanosPerMicro = 1'000;
constexpr Nanos kNanosPerMilli = 1'000'000;
constexpr Nanos kNanosPerSecond = 1'000'000'000;

constexpr double nanos_to_seconds(Nanos ns) { return static_cast<double>(ns) * 1e-9; }
constexpr Nanos seconds_to_nanos(double s) { return static_cast<Nanos>(s * 1e9); }

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  Nanos now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// Advanced explicitly; readable from any thread.
class VirtualClock final : public Clock {
 public:
  Nanos now() const override { return now_.load(std::memory_order_acquire); }
  // Moves time forward; never backwards (a smaller value is ignored).
  void advance_to(Nanos t) {
    Nanos cur = now_.load(std::memory_order_relaxed);
    while (t > cur && !now_.compare_exchange_weak(cur, t, std::memory_order_acq_rel)) {
    }
  }

 private:
  std::atomic<Nanos> now_{0};
};

}  // namespace kvtier
