// NvmeStore: what media errors do to the store (see the header's "Bad extents" and "Dead
// drives"). A failed request's extent is retired (a bad sector), up to a cap; media errors in a
// row on one file take that file out of service (a dead drive among several): its free extents
// are retired at once, the blocks on it are dropped and listed for take_lost_blocks(), and every
// extent of it freed later is retired too.
#include <chrono>
#include <string>

#include "kvtier/log.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/nvme_worker.hpp"

namespace kvtier {

void NvmeStore::mark_bad_locked(uint32_t extent, const std::string& why) {
  if (bad_[extent] != 0) return;
  const uint32_t most = max_retired_blocks();
  if (bad_marked_ >= most) {
    if (!said_failing_whole_) {
      said_failing_whole_ = true;
      log(LogLevel::kWarn, "NVMe store: " + why + "; " + std::to_string(most) +
                               " extents are retired already, so the device is failing as a " +
                               "whole, not at a few sectors: failed extents stay in service");
    }
    return;
  }
  bad_[extent] = 1;
  ++bad_marked_;
  log(LogLevel::kWarn, "NVMe store: " + why + "; extent " + std::to_string(extent) +
                           " is retired (" + std::to_string(bad_marked_) + " of at most " +
                           std::to_string(most) + ")");
}

void NvmeStore::note_media_error_locked(uint32_t extent, uint32_t file, const std::string& why) {
  mark_bad_locked(extent, why);
  if (file_health_.on_media_error(file)) take_file_out_locked(file, why);
}

void NvmeStore::take_file_out_locked(uint32_t file, const std::string& why) {
  const uint32_t free_retired = extents_->retire_free_in_file(file);
  // Its blocks go: ready ones now (an extent still read is retired when its last reader ends),
  // those being written when their writes end (write_finished).
  uint64_t dropped = 0;
  for (auto it = index_.begin(); it != index_.end();) {
    const Result<ExtentLocation> at = extents_->locate(it->second.extent);
    if (!at.ok() || at->file != file || it->second.state != EntryState::kReady) {
      ++it;
      continue;
    }
    const uint32_t extent = it->second.extent;
    lost_.push_back(it->first);
    has_lost_.store(true, std::memory_order_release);
    it = index_.erase(it);
    ++dropped;
    if (readers_[extent] == 0) {
      free_extent_locked(extent);
    } else {
      doomed_[extent] = 1;
    }
  }
  stats_->files_out_of_service.store(file_health_.out_of_service(), std::memory_order_relaxed);
  log(LogLevel::kError,
      "NVMe store: " + files_[file].path + " failed " +
          std::to_string(file_health_.failures_in_a_row()) +
          " requests in a row with media errors or no answer, none succeeding between (the last: " +
          why + "): it is out of service" +
          (file_health_.readmit_after().count() == 0
               ? std::string(" until the store is reopened")
               : " until a probe finds it answering (the next in " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        file_health_.probe_at(file) - NvmeFileHealth::Clock::now())
                                        .count()) +
                     " ms)") +
          "; its " + std::to_string(dropped) + " blocks are dropped and its " +
          std::to_string(files_[file].extent_count) + " extents retired (" +
          std::to_string(free_retired) +
          " free ones now, the others as their reads and writes end); " +
          std::to_string(files_.size() - file_health_.out_of_service()) + " of " +
          std::to_string(files_.size()) + " files stay in service");
}

bool NvmeStore::on_a_file_out_of_service_locked(uint32_t extent) const {
  if (file_health_.out_of_service() == 0) return false;  // the common case: no lookup
  const Result<ExtentLocation> at = extents_->locate(extent);
  return at.ok() && !file_health_.in_service(at->file);
}

void NvmeStore::free_extent_locked(uint32_t extent) {
  doomed_[extent] = 0;
  const bool retire = bad_[extent] != 0 || on_a_file_out_of_service_locked(extent);
  Status s = retire ? extents_->retire(extent) : extents_->free(extent);
  if (!s.ok()) log(LogLevel::kError, "NVMe store: " + s.to_string());
}

void NvmeStore::blame_extent(const Op& op, const std::string& why) {
  std::lock_guard<std::mutex> lock(index_mu_);
  // The read still counts as a reader here, so the extent is not reused yet, whether or not its
  // block was erased meanwhile: it is the extent that failed.
  note_media_error_locked(op.extent, op.file, why);
}

Status NvmeStore::failed_on_a_dead_drive(const Op& op, const Status& failed) {
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    if (file_health_.in_service(op.file)) return failed;
  }
  return unavailable(failed.message() + "; " + files_[op.file].path +
                     " is out of service after media errors in a row");
}

std::vector<BlockKey> NvmeStore::take_lost_blocks() {
  // Asked before every prompt is matched: no lock while no drive has lost anything.
  if (!has_lost_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(index_mu_);
  std::vector<BlockKey> lost;
  lost.swap(lost_);
  has_lost_.store(false, std::memory_order_relaxed);
  return lost;
}

}  // namespace kvtier
