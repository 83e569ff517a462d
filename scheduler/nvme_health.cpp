#include "scheduler/nvme_health.hpp"

#include <algorithm>

namespace kvtier {
namespace {

NvmePauseOptions pause_options(uint32_t after_failures, uint32_t pause_ms) {
  NvmePauseOptions o;
  o.after_failures = after_failures;
  o.first_pause = static_cast<Nanos>(pause_ms) * kNanosPerMilli;
  o.longest_pause = std::max(o.longest_pause, o.first_pause);
  return o;
}

}  // namespace

NvmePauseOptions nvme_write_pause_options(const NvmeTierConfig& config) {
  return pause_options(config.pause_after_failed_writes, config.pause_ms);
}

NvmePauseOptions nvme_read_pause_options(const NvmeTierConfig& config) {
  return pause_options(config.pause_after_failed_reads, config.pause_ms);
}

bool NvmeHealth::on_ok() {
  const bool outage_ended = last_pause_ != 0;
  failures_in_a_row_ = 0;
  last_pause_ = 0;
  return outage_ended;
}

std::optional<Nanos> NvmeHealth::on_failed() {
  if (paused_) return std::nullopt;  // an I/O in flight when the pause began
  failures_in_a_row_ += 1;
  if (options_.after_failures == 0 || failures_in_a_row_ < options_.after_failures) {
    return std::nullopt;
  }
  // The threshold reached, or a failure after a pause with no success since: pause (again).
  last_pause_ =
      last_pause_ == 0 ? options_.first_pause : std::min(options_.longest_pause, 2 * last_pause_);
  last_pause_ = std::max<Nanos>(last_pause_, 1);
  paused_ = true;
  return last_pause_;
}

}  // namespace kvtier
