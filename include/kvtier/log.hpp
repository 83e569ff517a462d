// Logging: one line per event, to a sink the embedder may replace.
//
// kvtier logs rarely — degradations (no huge pages, mlock refused, no GPU: emulated HBM), errors it
// recovered from (a port in use, a corrupt extent dropped) and lifecycle lines — never per page or
// per step. The default sink writes "kvtier[level] message" to stderr; `set_log_sink` redirects to
// the engine's own logger (the sink is called from any kvtier thread and must be thread-safe).
// `log_once` deduplicates by a caller-chosen key so a condition that persists is reported once per
// process. Levels below the threshold (KVTIER_LOG_LEVEL=debug|info|warn|error, default info) are
// dropped before formatting.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

constexpr std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

using LogSink = std::function<void(LogLevel, std::string_view)>;

namespace log_detail {

struct State {
  std::mutex mu;
  LogSink sink;  // empty = stderr
  std::set<std::string> once_keys;
  std::atomic<int> threshold{initial_threshold()};

  static int initial_threshold() {
    const char* env = std::getenv("KVTIER_LOG_LEVEL");
    if (env == nullptr) return static_cast<int>(LogLevel::kInfo);
    const std::string_view v(env);
    for (int l = 0; l <= 3; ++l) {
      if (v == log_level_name(static_cast<LogLevel>(l))) return l;
    }
    return static_cast<int>(LogLevel::kInfo);
  }
};

inline State& state() {
  static State s;
  return s;
}

}  // namespace log_detail

// Replaces the sink (an empty function restores stderr). Thread-safe.
inline void set_log_sink(LogSink sink) {
  auto& s = log_detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.sink = std::move(sink);
}

inline void set_log_level(LogLevel level) {
  log_detail::state().threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) >= log_detail::state().threshold.load(std::memory_order_relaxed);
}

inline void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  auto& s = log_detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.sink) {
    s.sink(level, message);
  } else {
    std::fprintf(stderr, "kvtier[%s] %.*s\n", std::string(log_level_name(level)).c_str(),
                 static_cast<int>(message.size()), message.data());
  }
}

// Logs `message` only the first time `key` is seen in this process.
inline void log_once(LogLevel level, std::string_view key, std::string_view message) {
  {
    auto& s = log_detail::state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.once_keys.emplace(key).second) return;
  }
  log(level, message);
}

}  // namespace kvtier
