// Timeouts and TTLs given in milliseconds (RuntimeOptions, kvt_runtime_params, the Python keyword
// arguments, prefix-pin TTLs): the one range check the C++, C and Python entry points share, and
// the clamp Runtime applies before it converts them to the nanoseconds the scheduler waits in.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"

namespace kvtier {

// The longest wait honoured: 100 years. A longer one, above all INT64_MAX (the usual way to say
// "never time out"), is clamped to this rather than refused: a serving engineer who asks for
// forever means it, and to a process 100 years is forever. The bound keeps every deadline built
// from a timeout far below INT64_MAX nanoseconds (292 years), where an unchecked conversion wrapped
// to a negative wait: steady_clock::now() + timeout (nanoseconds since boot), and the NVMe index
// recovery's 10 x call_timeout.
inline constexpr std::chrono::milliseconds kMaxTimeout{100LL * 365 * 24 * 3600 * 1000};

// OK when `ms` > 0; otherwise kInvalidArgument naming `field` (e.g. "params.call_timeout_ms").
// A zero or negative timeout is always a mistake: there is no "do not wait" mode to mean by it.
inline Status check_timeout_ms(int64_t ms, std::string_view field) {
  if (ms > 0) return ok_status();
  return invalid_argument(std::string(field) + " is " + std::to_string(ms) +
                          "; it must be > 0 (milliseconds)");
}

// A timeout that passed check_timeout_ms, no longer than kMaxTimeout.
inline std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds t) {
  return std::min(t, kMaxTimeout);
}

// A clamped timeout in nanoseconds: cannot overflow (kMaxTimeout is ~3.2e18 ns).
inline int64_t timeout_nanos(std::chrono::milliseconds t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clamp_timeout(t)).count();
}

}  // namespace kvtier
