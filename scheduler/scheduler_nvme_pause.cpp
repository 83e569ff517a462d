// Scheduler: pausing writes to NVMe when they keep failing, and resuming them (NvmeWriteHealth
// decides; this carries the decision into the placement, the stats and the open steps).
#include <string>

#include "kvtier/log.hpp"
#include "scheduler/scheduler.hpp"

namespace kvtier {

void Scheduler::note_nvme_write(const Status& written) {
  if (written.ok()) {
    nvme_health_.on_write_ok();
    return;
  }
  // A block NVMe cannot encode (fp8 and NaN or inf) says nothing of the disk; nor does a write
  // cancelled at shutdown.
  if (written.code() == StatusCode::kInvalidArgument || written.code() == StatusCode::kCancelled) {
    return;
  }
  const uint32_t in_a_row = nvme_health_.failures_in_a_row() + 1;
  const std::optional<Nanos> pause = nvme_health_.on_write_failed();
  if (!pause) return;
  placement_->set_nvme_writable(false);
  stats_.nvme_write_pauses.fetch_add(1, std::memory_order_relaxed);
  stats_.nvme_writes_paused.store(1, std::memory_order_relaxed);
  const std::string what =
      "writes to NVMe are paused for " + std::to_string(*pause / kNanosPerMilli) + " ms after " +
      std::to_string(in_a_row) + " failed in a row, the last with " + written.to_string();
  log(LogLevel::kWarn, what + "; blocks in use stay in memory, NVMe copies are still read");
  nvme_resume_timer_ = parts_.loop->post_after(*pause, [this] { resume_nvme_writes(); });
  fail_steps_that_no_longer_fit(what + ", so every block in use must stay in memory");
}

void Scheduler::resume_nvme_writes() {
  nvme_resume_timer_ = 0;
  nvme_health_.resume();
  placement_->set_nvme_writable(true);
  stats_.nvme_writes_paused.store(0, std::memory_order_relaxed);
  // What could leave host memory only by way of NVMe may go now.
  want_watermark_check();
  serve_memory_waiters();
}

}  // namespace kvtier
