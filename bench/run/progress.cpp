// Progress bar. See progress.hpp.
#include "bench/run/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace kvtier::bench::run {

ProgressBar::ProgressBar(std::ostream& err, bool enabled, std::vector<std::string> names,
                         uint64_t total)
    : err_(err),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) == 1),
      names_(std::move(names)),
      total_(std::max<uint64_t>(1, total)),
      counters_(new std::atomic<uint64_t>[names_.size()]) {
  for (std::size_t i = 0; i < names_.size(); ++i) counters_[i].store(0);
}

ProgressBar::~ProgressBar() { stop(); }

void ProgressBar::start() {
  started_ = std::chrono::steady_clock::now();
  if (!enabled_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(tty_ ? 250 : 1000));
      if (!stopping_) draw(false);
    }
  });
}

void ProgressBar::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  draw(true);
}

void ProgressBar::draw(bool final) {
  uint64_t done = 0;
  for (std::size_t i = 0; i < names_.size(); ++i)
    done += std::min(total_, counters_[i].load(std::memory_order_relaxed));
  const double frac = static_cast<double>(done) / static_cast<double>(total_ * names_.size());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::ostringstream line;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(frac * kWidth);
  line << "[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
       << static_cast<int>(frac * 100) << "%";
  for (std::size_t i = 0; i < names_.size(); ++i) {
    line << "  " << names_[i] << " "
         << std::min(total_, counters_[i].load(std::memory_order_relaxed)) << "/" << total_;
  }
  char t[32];
  std::snprintf(t, sizeof t, "  %.0fs", secs);
  line << t;
  if (tty_) {
    err_ << "\r" << line.str() << "\x1b[K";
    if (final) err_ << "\n";
    err_.flush();
    return;
  }
  const int tenth = static_cast<int>(frac * 10);
  if (tenth != last_tenth_ || final) {
    last_tenth_ = tenth;
    err_ << line.str() << "\n";
    err_.flush();
  }
}

}  // namespace kvtier::bench::run
