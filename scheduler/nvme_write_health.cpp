#include "scheduler/nvme_write_health.hpp"

#include <algorithm>

namespace kvtier {

NvmeWritePauseOptions nvme_pause_options(const NvmeTierConfig& config) {
  NvmeWritePauseOptions o;
  o.after_failed_writes = config.pause_after_failed_writes;
  o.first_pause = static_cast<Nanos>(config.pause_ms) * kNanosPerMilli;
  o.longest_pause = std::max(o.longest_pause, o.first_pause);
  return o;
}

bool NvmeWriteHealth::on_write_ok() {
  const bool outage_ended = last_pause_ != 0;
  failures_in_a_row_ = 0;
  last_pause_ = 0;
  return outage_ended;
}

std::optional<Nanos> NvmeWriteHealth::on_write_failed() {
  if (paused_) return std::nullopt;  // a write in flight when the pause began
  failures_in_a_row_ += 1;
  if (options_.after_failed_writes == 0 || failures_in_a_row_ < options_.after_failed_writes) {
    return std::nullopt;
  }
  // The threshold reached, or a failure after a pause with no success since: pause (again).
  last_pause_ =
      last_pause_ == 0 ? options_.first_pause : std::min(options_.longest_pause, 2 * last_pause_);
  last_pause_ = std::max<Nanos>(last_pause_, 1);
  paused_ = true;
  pauses_ += 1;
  return last_pause_;
}

}  // namespace kvtier
