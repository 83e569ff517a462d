// Scheduler: how it answers a failing disk. Writes that keep failing pause writing to NVMe, and
// resume (NvmeHealth decides; this carries the decision into the placement, the stats and the
// open steps). Reads that keep failing pause reading from NVMe: compute-or-load and the hints
// read there only while nvme_readable(), and prefetches queued before the pause end unstarted
// when their turn comes (skip_paused_prefetch). Extents the store retires after media errors leave
// the table's count, and blocks it lost with a dead drive leave the table.
#include <iterator>
#include <string>
#include <vector>

#include "kvtier/log.hpp"
#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

void Scheduler::note_nvme_write(const Status& written) {
  if (written.ok()) {
    if (nvme_write_health_.on_ok()) lift_disk_refusals();
    return;
  }
  if (!is_disk_write_failure(written)) return;
  const uint32_t in_a_row = nvme_write_health_.failures_in_a_row() + 1;
  const std::optional<Nanos> pause = nvme_write_health_.on_failed();
  if (!pause) return;
  placement_->set_nvme_writable(false);
  stats_.nvme_write_pauses.fetch_add(1, std::memory_order_relaxed);
  stats_.nvme_writes_paused.store(1, std::memory_order_relaxed);
  const std::string what =
      "writes to NVMe are paused for " + std::to_string(*pause / kNanosPerMilli) + " ms after " +
      std::to_string(in_a_row) + " failed in a row, the last with " + written.to_string();
  log(LogLevel::kWarn, what + "; blocks in use stay in memory, NVMe copies are still read");
  nvme_write_resume_timer_ = parts_.loop->post_after(*pause, [this] { resume_nvme_writes(); });
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
  nvme_write_resume_timer_ = 0;
  nvme_write_health_.resume();
  placement_->set_nvme_writable(true);
  stats_.nvme_writes_paused.store(0, std::memory_order_relaxed);
  // What could leave host memory only by way of NVMe may go now.
  want_watermark_check();
  serve_memory_waiters();
}

void Scheduler::note_nvme_read(const Status& read) {
  if (read.ok()) {
    if (nvme_read_health_.on_ok()) {
      log(LogLevel::kInfo, "reads from NVMe succeed again after an outage");
    }
    return;
  }
  if (!is_disk_read_failure(read)) return;
  const uint32_t in_a_row = nvme_read_health_.failures_in_a_row() + 1;
  const std::optional<Nanos> pause = nvme_read_health_.on_failed();
  if (!pause) return;
  stats_.nvme_read_pauses.fetch_add(1, std::memory_order_relaxed);
  stats_.nvme_reads_paused.store(1, std::memory_order_relaxed);
  log(LogLevel::kWarn, "reads from NVMe are paused for " + std::to_string(*pause / kNanosPerMilli) +
                           " ms after " + std::to_string(in_a_row) +
                           " failed in a row, the last with " + read.to_string() +
                           "; prompts recompute the blocks cached only there, which stay");
  nvme_read_resume_timer_ = parts_.loop->post_after(*pause, [this] { resume_nvme_reads(); });
}

void Scheduler::resume_nvme_reads() {
  nvme_read_resume_timer_ = 0;
  nvme_read_health_.resume();
  stats_.nvme_reads_paused.store(0, std::memory_order_relaxed);
}

void Scheduler::forget_lost_nvme_blocks() {
  if (parts_.nvme == nullptr) return;
  std::vector<BlockKey> lost = parts_.port->take_lost_nvme_blocks();
  if (lost.empty() && lost_nvme_later_.empty()) return;
  lost.insert(lost.end(), lost_nvme_later_.begin(), lost_nvme_later_.end());
  lost_nvme_later_.clear();
  uint64_t forgotten = 0;
  for (const BlockKey& key : lost) {
    // A read in flight ends first (its failure drops the copy as any failed read's does); a
    // write that landed on the dead drive is forgotten once its copy is ready.
    const CopyState nvme = page_snapshot(key, 0).nvme;
    if (reading_.contains(key) || nvme == CopyState::kFilling) {
      lost_nvme_later_.push_back(key);
      continue;
    }
    if (nvme != CopyState::kReady) continue;
    drop_nvme_copy(key);
    note_if_lost(key);
    after_change(key);
    ++forgotten;
  }
  if (forgotten == 0) return;
  stats_.nvme_blocks_lost.fetch_add(forgotten, std::memory_order_relaxed);
  log(LogLevel::kWarn, "NVMe lost " + std::to_string(forgotten) +
                           (forgotten == 1 ? " block" : " blocks") +
                           " with a drive taken out of service; they are misses now");
  want_watermark_check();
}

uint64_t Scheduler::take_retired_nvme_extents() {
  if (parts_.nvme == nullptr) return 0;
  forget_lost_nvme_blocks();
  const uint64_t retired_by_store = parts_.port->nvme_retired_extents();
  if (parts_.nvme->retired() > retired_by_store) {
    // A drive readmitted: its extents hold nothing the table knows of (its blocks were forgotten
    // when it went out), so any retired extent of the table's will do.
    const uint32_t back = parts_.nvme->unretire_up_to(
        static_cast<uint32_t>(parts_.nvme->retired() - retired_by_store));
    stats_.nvme_retired_extents.store(parts_.nvme->retired(), std::memory_order_relaxed);
    want_watermark_check();
    log(LogLevel::kInfo, "the NVMe store put " + std::to_string(back) +
                             " extents back in service (a drive readmitted); " +
                             std::to_string(parts_.nvme->in_service()) + " in service");
    return 0;
  }
  uint64_t taken = 0;
  while (parts_.nvme->retired() < retired_by_store) {
    Result<uint32_t> extent = parts_.nvme->allocate();
    if (!extent.ok()) break;  // every extent holds a block: a later call takes one freed then
    Status retired = parts_.nvme->retire(*extent);
    if (!retired.ok()) {
      log(LogLevel::kError, "retiring an NVMe extent of the page table: " + retired.to_string());
      parts_.nvme->free(*extent).ignore();
      break;
    }
    ++taken;
  }
  if (taken == 0) return 0;
  stats_.nvme_retired_extents.store(parts_.nvme->retired(), std::memory_order_relaxed);
  want_watermark_check();
  fail_steps_that_no_longer_fit("the NVMe store retired " + std::to_string(taken) +
                                " extents after media errors (" +
                                std::to_string(parts_.nvme->in_service()) + " left in service)");
  return taken;
}

}  // namespace kvtier
