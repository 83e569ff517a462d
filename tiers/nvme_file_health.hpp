// NvmeFileHealth: which files (drives) of an NVMe store are in service, judged by media errors,
// and when one taken out is tried again.
//
// A bad sector fails the requests that touch it and no others; the store retires its extent and
// goes on. A dead drive fails every request, and a hung one answers none (the store counts a
// request past tiers.nvme.io_timeout_ms, and each one refused while it waits, as a failure too).
// With the store spread over several files, one per drive, the store should stop using that
// file, not the whole tier: `failures_in_a_row` such failures on one file, with no request to
// that file succeeding between them, take the file out of service
// (tiers.nvme.out_of_service_after_failures; a few scattered bad sectors never do: requests
// elsewhere in the file succeed between). The last file in service never leaves: with one drive
// left, the scheduler's pauses decide when to try it again.
//
// Readmission (tiers.nvme.readmit_after_ms): a drive often comes back, after the kernel resets a
// controller that hung, or a cable is reseated. A file out of service is due for a probe (the
// store reads its superblock) `readmit_after` after it went out; a probe that fails makes the
// next one due after twice the wait before it, up to kMostWaits times the first, and so does the
// file's going out again after a readmission, so a drive that keeps failing is tried ever less
// often. A probe that succeeds puts the file back in service. `readmit_after` 0: a file stays
// out until the store is reopened.
//
// Plain state, guarded by the store's index mutex; time is passed in, so tests choose it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace kvtier {

class NvmeFileHealth {
 public:
  using Clock = std::chrono::steady_clock;
  // As many as the scheduler's pauses count by default (tiers.nvme.pause_after_failed_writes and
  // _reads): with a dead drive among several, the store takes it out no later than the pause would
  // stop every drive, and failures from then on are not counted against the others.
  static constexpr uint32_t kDefaultFailuresInARow = 8;
  // The longest wait before a probe, as a multiple of the first.
  static constexpr uint32_t kMostWaits = 16;

  // `failures_in_a_row` 0: no file is ever taken out of service. `readmit_after` 0: a file out of
  // service is never probed.
  explicit NvmeFileHealth(uint32_t files = 0, uint32_t failures_in_a_row = kDefaultFailuresInARow,
                          std::chrono::milliseconds readmit_after = std::chrono::milliseconds(0))
      : files_(files), failures_in_a_row_(failures_in_a_row), readmit_after_(readmit_after) {
    for (File& f : files_) f.next_wait = readmit_after;
  }

  // A request to `file` succeeded: its media errors in a row start again from none.
  void on_ok(uint32_t file) { files_.at(file).errors_in_a_row = 0; }
  // A request to `file` failed with a media error. True when this error takes the file out of
  // service (it was in service, reached failures_in_a_row, and another file is in service).
  // `now` starts its wait for a probe.
  bool on_media_error(uint32_t file, Clock::time_point now = Clock::now()) {
    File& f = files_.at(file);
    f.errors_in_a_row += 1;
    if (failures_in_a_row_ == 0 || f.out_of_service) return false;
    if (f.errors_in_a_row < failures_in_a_row_) return false;
    if (files_.size() - out_of_service_ <= 1) return false;  // the last file in service stays
    f.out_of_service = true;
    out_of_service_ += 1;
    probe_later(f, now);
    return true;
  }

  // `file` is out of service from the start (the store opened without it: its path is missing or
  // its superblock unreadable); its probe is due as after any outage. The caller keeps another
  // file in service.
  void take_out(uint32_t file, Clock::time_point now) {
    File& f = files_.at(file);
    if (f.out_of_service) return;
    f.out_of_service = true;
    out_of_service_ += 1;
    probe_later(f, now);
  }

  // The files out of service whose probe is due at `now`, each now counted as being probed (one
  // probe at a time per file) until probe_ended. Cheap while every file is in service.
  std::vector<uint32_t> probes_due(Clock::time_point now) {
    std::vector<uint32_t> due;
    if (out_of_service_ == 0 || readmit_after_.count() == 0) return due;
    for (uint32_t i = 0; i < files_.size(); ++i) {
      File& f = files_[i];
      if (!f.out_of_service || f.probing || now < f.probe_at) continue;
      f.probing = true;
      due.push_back(i);
    }
    return due;
  }
  // The probe of `file` ended. `ok`: the file is back in service, its count of errors starts
  // again (true is returned). Otherwise the next probe waits twice as long as this one did.
  bool probe_ended(uint32_t file, bool ok, Clock::time_point now) {
    File& f = files_.at(file);
    f.probing = false;
    if (!f.out_of_service) return false;
    if (!ok) {
      probe_later(f, now);
      return false;
    }
    f.out_of_service = false;
    f.errors_in_a_row = 0;
    out_of_service_ -= 1;
    return true;
  }
  // When the next probe of `file` is due (meaningful while it is out of service).
  Clock::time_point probe_at(uint32_t file) const { return files_.at(file).probe_at; }
  bool in_service(uint32_t file) const { return !files_.at(file).out_of_service; }
  uint32_t errors_in_a_row(uint32_t file) const { return files_.at(file).errors_in_a_row; }
  uint32_t out_of_service() const { return out_of_service_; }
  uint32_t failures_in_a_row() const { return failures_in_a_row_; }
  std::chrono::milliseconds readmit_after() const { return readmit_after_; }

 private:
  struct File {
    uint32_t errors_in_a_row = 0;
    bool out_of_service = false;
    bool probing = false;
    Clock::time_point probe_at;
    std::chrono::milliseconds next_wait{0};  // the wait the next probe_later sets
  };
  void probe_later(File& f, Clock::time_point now) const {
    f.probe_at = now + f.next_wait;
    f.next_wait = std::min(f.next_wait * 2, readmit_after_ * kMostWaits);
  }

  std::vector<File> files_;
  uint32_t failures_in_a_row_ = kDefaultFailuresInARow;
  std::chrono::milliseconds readmit_after_{0};
  uint32_t out_of_service_ = 0;
};

}  // namespace kvtier
