// Scheduler: pausing writes to NVMe when they keep failing, and resuming them (NvmeWriteHealth
// decides; this carries the decision into the placement, the stats and the open steps).
#include <iterator>
#include <string>

#include "kvtier/log.hpp"
#include "scheduler/scheduler.hpp"

namespace kvtier {

void Scheduler::note_nvme_write(const Status& written) {
  if (written.ok()) {
    if (nvme_health_.on_write_ok()) lift_disk_refusals();
    return;
  }
  if (!is_disk_failure(written)) return;
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

void Scheduler::lift_disk_refusals() {
  uint64_t lifted = 0;
  const uint8_t lift = kRefusedByFailingDisk | static_cast<uint8_t>(1u << tier_index(Tier::kNvme));
  for (auto it = refused_.begin(); it != refused_.end();) {
    if ((it->second & kRefusedByFailingDisk) == 0) {
      ++it;
      continue;
    }
    ++lifted;
    it->second &= static_cast<uint8_t>(~lift);
    it = it->second == 0 ? refused_.erase(it) : std::next(it);
  }
  if (lifted == 0) return;
  log(LogLevel::kInfo, "writes to NVMe succeed again: " + std::to_string(lifted) +
                           " blocks the failed writes refused may go there again");
  want_watermark_check();
  serve_memory_waiters();
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
