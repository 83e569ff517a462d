// NvmeStore: what a hung drive does to the store (see the header's "Hung drives"). A request the
// drive leaves unanswered past tiers.nvme.io_timeout_ms counts against its file as a media error
// would (NvmeFileHealth), and every new request to that file fails at once, counted the same way,
// until the drive has answered each one: a hung drive among several is taken out of service
// after as many as a dead one, and none of its requests piles up behind the others meanwhile.
#include <string>

#include "kvtier/log.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/nvme_worker.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {

void NvmeStore::note_unanswered(const Op& op, const std::string& what) {
  std::lock_guard<std::mutex> lock(index_mu_);
  stats_->io_timeouts.fetch_add(1, std::memory_order_relaxed);
  stats_->requests_unanswered.fetch_add(1, std::memory_order_relaxed);
  if (unanswered_[op.file]++ == 0) {
    log(LogLevel::kWarn, "NVMe store: " + what + "; requests to " + files_[op.file].path +
                             " fail at once until it answers every one");
  }
  if (file_health_.on_media_error(op.file)) take_file_out_locked(op.file, what);
}

void NvmeStore::note_answered(const Op& op) {
  std::lock_guard<std::mutex> lock(index_mu_);
  stats_->requests_unanswered.fetch_sub(1, std::memory_order_relaxed);
  if (--unanswered_[op.file] == 0) {
    log(LogLevel::kInfo, "NVMe store: " + files_[op.file].path +
                             " has answered every request that passed its timeout");
  }
}

Status NvmeStore::refuse_on_a_hung_drive_locked(uint32_t file, const std::string& what) {
  const uint32_t waiting = unanswered_[file];
  if (waiting == 0) return Status();
  const std::string why = what + ": " + files_[file].path + " has " + std::to_string(waiting) +
                          " requests unanswered past tiers.nvme.io_timeout_ms (" +
                          std::to_string(options_.config.io_timeout_ms) + " ms)";
  if (file_health_.on_media_error(file)) take_file_out_locked(file, why);
  if (!file_health_.in_service(file)) {
    return unavailable(why + "; it is out of service after failing requests in a row");
  }
  return deadline_exceeded(why + "; nothing is sent there until it answers");
}

Status NvmeStore::refuse_on_a_hung_drive(const Op& op) {
  if (stats_->requests_unanswered.load(std::memory_order_relaxed) == 0) return Status();
  std::lock_guard<std::mutex> lock(index_mu_);
  std::string what = "block " + key_text(op.key);
  if (op.kind == Op::Kind::kScan) what = "header of extent " + std::to_string(op.extent);
  if (op.kind == Op::Kind::kProbe) what = "probe of its superblock";
  return refuse_on_a_hung_drive_locked(op.file, what);
}

std::vector<std::shared_ptr<TransferState>> NvmeStore::abandon_write(const Op& op) {
  std::lock_guard<std::mutex> lock(index_mu_);
  doomed_[op.extent] = 1;  // draining: reserved until the write ends
  auto it = index_.find(op.key);
  if (it == index_.end() || it->second.generation != op.generation) return {};
  std::vector<std::shared_ptr<TransferState>> joined = std::move(it->second.joined);
  index_.erase(it);
  return joined;
}

void NvmeStore::abandoned_write_ended(const Op& op, bool ok) {
  std::lock_guard<std::mutex> lock(index_mu_);
  if (ok) {
    file_health_.on_ok(op.file);
  } else if (is_media_error(op.io_errno)) {
    // Its timeout already counted against the file; the extent is what failed.
    mark_bad_locked(op.extent, "abandoned write of " + key_text(op.key) +
                                   " failed with a media error (" + errno_text(op.io_errno) + ")");
  }
  free_extent_locked(op.extent);
}

}  // namespace kvtier
