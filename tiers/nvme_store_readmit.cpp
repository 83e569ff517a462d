// NvmeStore: a drive taken out of service comes back (see the header's "Readmission"). When a
// write is posted and a file out of service is due for a probe (NvmeFileHealth::probes_due), an
// I/O thread reads that file's superblock. A probe that reads this store's superblock for that
// file puts the file back in service, empty: its extents return to the allocator, but those
// marked bad, which stay retired until a restart. A probe that fails (an I/O error, no answer
// within tiers.nvme.io_timeout_ms, a refusal while the drive still holds unanswered requests, or a
// superblock not of this file: a replaced or wiped drive) leaves it out, and the next probe waits
// twice as long.
#include <fcntl.h>

#include <chrono>
#include <string>

#include "kvtier/log.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/nvme_worker.hpp"

namespace kvtier {

void NvmeStore::post_due_probes_locked() {
  if (file_health_.out_of_service() == 0) return;  // the common case: no clock read
  for (uint32_t file : file_health_.probes_due(NvmeFileHealth::Clock::now())) {
    // Its path is opened afresh: a replaced drive's file system may be mounted there now
    // (nvme_store_replace.cpp).
    Status opened = reopen_for_probe_locked(file);
    if (!opened.ok()) {
      stats_->nvme_probes.fetch_add(1, std::memory_order_relaxed);
      probe_finished_locked(file, opened, /*formatted=*/false);
      continue;
    }
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kProbe;
    op->file = file;
    op->fd = files_[file].fd.get();
    // The superblock, read as O_DIRECT wants it: whole aligned blocks into an aligned buffer.
    op->probe_bytes = std::max<uint64_t>(kSuperblockBytes, layout_.io_align);
    op->probe_buffer =
        aligned_bytes(std::max<std::size_t>(4096, layout_.io_align), op->probe_bytes);
    if (!op->probe_buffer) {
      probe_finished_locked(file, resource_exhausted("no memory for a probe's superblock buffer"),
                            /*formatted=*/false);
      continue;
    }
    stats_->nvme_probes.fetch_add(1, std::memory_order_relaxed);
    post(std::move(op));  // lock order: index_mu_, then the worker's inbox
  }
}

Status NvmeStore::check_probe(const Op& op) const {
  const std::string& path = files_[op.file].path;
  Result<Superblock> sb =
      decode_superblock(std::span<const std::byte>(op.probe_buffer.get(), kSuperblockBytes), path);
  if (!sb.ok()) return sb.status();
  if (sb->store_id != store_id_ || sb->file_index != op.file || sb->fingerprint != fingerprint_) {
    return failed_precondition(path + " now holds file " + std::to_string(sb->file_index) +
                               " of store " + hex64(sb->store_id) + ", not file " +
                               std::to_string(op.file) + " of store " + hex64(store_id_));
  }
  // A file the store opened without was given as many extents as its first file.
  if (sb->file_count != files_.size() || sb->extent_count != files_[op.file].extent_count) {
    return failed_precondition(path + " holds " + std::to_string(sb->extent_count) +
                               " extents of a store of " + std::to_string(sb->file_count) +
                               " files; this store counts " +
                               std::to_string(files_[op.file].extent_count) + " extents of " +
                               std::to_string(files_.size()) + " for it (a restart uses it)");
  }
  return Status();
}

void NvmeStore::probe_answered(const Op& op, const Status& result) {
  if (op.probe_formats) {
    probe_finished(op, result);
    return;
  }
  if (found_blank(op, result)) {
    // A replaced drive: the probe goes on as the write of its superblock.
    Status posted = post_format(op);
    if (!posted.ok()) probe_finished(op, posted);
    return;
  }
  probe_finished(op, result.ok() ? check_probe(op) : result);
}

void NvmeStore::probe_finished(const Op& op, const Status& result) {
  std::lock_guard<std::mutex> lock(index_mu_);
  probe_finished_locked(op.file, result, op.probe_formats);
}

void NvmeStore::forget_bad_marks_locked(uint32_t file) {
  const uint32_t first = extents_->first_extent_of(file);
  for (uint32_t e = first; e < first + files_[file].extent_count; ++e) {
    if (bad_[e] == 0) continue;
    bad_[e] = 0;
    --bad_marked_;
  }
}

void NvmeStore::probe_finished_locked(uint32_t file, const Status& result, bool formatted) {
  const auto now = NvmeFileHealth::Clock::now();
  const std::string& path = files_[file].path;
  if (!file_health_.probe_ended(file, result.ok(), now)) {
    // A probe cancelled as the store closes says nothing of the drive.
    if (!result.ok() && result.code() != StatusCode::kCancelled && !file_health_.in_service(file)) {
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(file_health_.probe_at(file) - now);
      log(LogLevel::kWarn, "NVMe store: " + path + " stays out of service: its probe failed (" +
                               result.to_string() + "); the next in " +
                               std::to_string(wait.count()) + " ms");
    }
    return;
  }
  // Back in service: its extents are handed out again, and those still held (reads, writes and
  // abandoned writes in flight) are freed, not retired, when let go. Those marked bad stay
  // retired, as until a restart anywhere: a drive taken out by a bad region of adjacent extents,
  // not by its death, would otherwise meet the same region again and go out again, dropping every
  // block written meanwhile, at each probe interval. A dead drive's last failures cost as many
  // extents, within the one-in-32 cap, until a restart.
  // A drive formatted in place of the lost one has none of its bad sectors.
  if (formatted) forget_bad_marks_locked(file);
  const uint32_t back = extents_->unretire_in_file(file, bad_);
  stats_->files_out_of_service.store(file_health_.out_of_service(), std::memory_order_relaxed);
  stats_->files_readmitted.fetch_add(1, std::memory_order_relaxed);
  if (formatted) stats_->files_replaced.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::kInfo,
      "NVMe store: " + path +
          (formatted ? " was formatted in place of the lost file" : " answered its probe") +
          ": it is back in service with " + std::to_string(back) + " free extents; " +
          std::to_string(files_.size() - file_health_.out_of_service()) + " of " +
          std::to_string(files_.size()) + " files in service");
}

}  // namespace kvtier
