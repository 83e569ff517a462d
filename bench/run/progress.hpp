// A progress bar on stderr for runs that take minutes: one counter per baseline (requests finished
// out of the workload's), redrawn in place a few times a second by a thread of its own while the
// baselines run on theirs. When stderr is not a terminal it prints a plain line at every tenth
// of the way instead, so logs stay readable. Disabled, it prints nothing and starts no thread.
// The counters are the only shared state (relaxed atomics); stop() joins the thread and ends the
// line.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::bench::run {

class ProgressBar {
 public:
  ProgressBar(std::ostream& err, bool enabled, std::vector<std::string> names, uint64_t total);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  std::atomic<uint64_t>* counter(std::size_t i) { return &counters_[i]; }
  void start();
  void stop();

 private:
  void draw(bool final);

  std::ostream& err_;
  bool enabled_;
  bool tty_;
  std::vector<std::string> names_;
  uint64_t total_;
  std::unique_ptr<std::atomic<uint64_t>[]> counters_;
  std::chrono::steady_clock::time_point started_;
  int last_tenth_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvtier::bench::run
