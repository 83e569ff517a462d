// NvmeStore: a drive taken out of service comes back (see the header's "Readmission"). When a
// write is posted and a file out of service is due for a probe (NvmeFileHealth::probes_due), an
// I/O thread reads that file's superblock. A probe that reads this store's superblock for that
// file writes it back, the same bytes, and once that write lands puts the file back in service,
// empty: its extents return to the allocator, but those marked bad, which stay retired until a
// restart. A probe that fails (an I/O error, no answer within tiers.nvme.io_timeout_ms, a refusal
// while the drive still holds unanswered requests, a write refused, or a superblock not of this
// file: a foreign or damaged one) leaves it out, and the next probe waits twice as long. A probe
// that finds the file blank formats it instead (a replaced drive: nvme_store_replace.cpp).
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
    Result<SharedFd> opened = reopen_for_probe_locked(file);
    if (!opened.ok()) {
      stats_->nvme_probes.fetch_add(1, std::memory_order_relaxed);
      probe_finished_locked(file, opened.status(), /*formatted=*/false, /*extents=*/0);
      continue;
    }
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kProbe;
    op->file = file;
    op->adopt_fd = opened->valid();
    op->fd = op->adopt_fd ? std::move(opened).value() : files_[file].fd;
    op->probe_bytes = probe_bytes();
    op->probe_buffer = new_probe_buffer();
    if (!op->probe_buffer) {
      probe_finished_locked(file, resource_exhausted("no memory for a probe's superblock buffer"),
                            /*formatted=*/false, /*extents=*/0);
      continue;
    }
    stats_->nvme_probes.fetch_add(1, std::memory_order_relaxed);
    post(std::move(op));  // lock order: index_mu_, then the worker's inbox
  }
}

Result<uint64_t> NvmeStore::check_probe(const Op& op) const {
  StoreFileReport r;
  r.path = files_[op.file].path;
  KVTIER_ASSIGN_OR_RETURN(
      r.superblock,
      decode_superblock(std::span<const std::byte>(op.probe_buffer.get(), kSuperblockBytes),
                        r.path));
  KVTIER_ASSIGN_OR_RETURN(r.info, options_.backend->stat(op.fd.get(), r.path));
  // The same checks as the open's, against the store as it opened.
  const Reason unfit =
      check_store_file(r, op.file, files_.size(), superblock_of(0, 0, extents_->first_offset()),
                       layout_, format_, direct_io_);
  if (!unfit.ok()) return unfit.status().with_context(r.path);
  // A file the store opened without was given as many extents as its first file: one that holds
  // fewer (a smaller block device) uses those, one that holds more the store's count, until a
  // restart sizes it by its own superblock.
  return std::min<uint64_t>(r.superblock->extent_count, files_[op.file].extent_count);
}

void NvmeStore::probe_answered(const Op& op, const Status& result) {
  if (op.probe_writes) {  // the superblock written back, or a new one: the probe's last step
    probe_finished(op, result);
    return;
  }
  Status next;
  if (found_blank(op, result)) {
    next = post_format(op);  // a replaced drive: the probe goes on as the write of a new superblock
  } else if (!result.ok()) {
    next = result;
  } else {
    Result<uint64_t> extents = check_probe(op);
    next = extents.ok() ? post_write_back(op, *extents) : extents.status();
  }
  if (!next.ok()) probe_finished(op, next);
}

Status NvmeStore::post_write_back(const Op& probe, uint64_t extents) {
  // The same bytes (a torn write leaves them as they were): a drive gone read-only reads well,
  // and once readmitted would fail every write.
  AlignedBytes back = new_probe_buffer();
  if (!back) return resource_exhausted("no memory for a probe's superblock buffer");
  std::copy_n(probe.probe_buffer.get(), probe.probe_bytes, back.get());
  post_probe_write(probe, std::move(back), /*formats=*/false, extents);
  return Status();
}

AlignedBytes NvmeStore::new_probe_buffer() const {
  // The superblock, as O_DIRECT wants it: whole aligned blocks, in an aligned buffer.
  return aligned_bytes(std::max<std::size_t>(4096, layout_.io_align), probe_bytes());
}

uint64_t NvmeStore::probe_bytes() const {
  return std::max<uint64_t>(kSuperblockBytes, layout_.io_align);
}

void NvmeStore::post_probe_write(const Op& probe, AlignedBytes superblock, bool formats,
                                 uint64_t extents) {
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kProbe;
  op->file = probe.file;
  op->fd = probe.fd;
  op->adopt_fd = probe.adopt_fd;
  op->probe_writes = true;
  op->probe_formats = formats;
  op->probe_extents = extents;
  op->probe_bytes = probe_bytes();
  op->probe_buffer = std::move(superblock);
  post(std::move(op));
}

void NvmeStore::probe_finished(const Op& op, const Status& result) {
  std::lock_guard<std::mutex> lock(index_mu_);
  // A block device the probe opened afresh is the file's from now on (before the extents it
  // readmits are handed out): the old descriptor may reach a drive removed under the same name.
  if (result.ok() && op.adopt_fd) adopt_locked(op.file, op.fd);
  probe_finished_locked(op.file, result, op.probe_formats, op.probe_extents);
}

void NvmeStore::forget_bad_marks_locked(uint32_t file) {
  const uint32_t first = extents_->first_extent_of(file);
  for (uint32_t e = first; e < first + files_[file].extent_count; ++e) {
    if (bad_[e] == 0) continue;
    bad_[e] = 0;
    --bad_marked_;
  }
}

void NvmeStore::probe_finished_locked(uint32_t file, const Status& result, bool formatted,
                                      uint64_t extents) {
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
  const uint32_t first = extents_->first_extent_of(file);
  const uint32_t end = first + static_cast<uint32_t>(files_[file].extent_count);
  uint32_t back = 0;
  if (extents < files_[file].extent_count) {
    // A drive that holds fewer extents than its place in the store: the rest stay retired.
    std::vector<uint8_t> keep = bad_;
    std::fill(keep.begin() + first + extents, keep.begin() + end, uint8_t{1});
    back = extents_->unretire_in_file(file, keep);
  } else {
    back = extents_->unretire_in_file(file, bad_);
  }
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
