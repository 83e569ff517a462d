// NvmeFileHealth: which files (drives) of an NVMe store are in service, judged by media errors.
//
// A bad sector fails the requests that touch it and no others; the store retires its extent and
// goes on. A dead drive fails every request, and a hung one answers none (the store counts a
// request past tiers.nvme.io_timeout_ms, and each one refused while it waits, as a failure too).
// With the store spread over several files, one per drive, the store should stop using that
// file, not the whole tier: `failures_in_a_row` such failures on one file, with no request to
// that file succeeding between them, take the file out of service
// (tiers.nvme.out_of_service_after_failures; a few scattered bad sectors never do: requests
// elsewhere in the file succeed between). The last file in service never leaves: with one drive
// left, the scheduler's pauses decide when to try it again. Out of service lasts until the store
// is reopened (a replaced drive, or one that recovered, comes back with a restart).
//
// Plain state, guarded by the store's index mutex.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier {

class NvmeFileHealth {
 public:
  // As many as the scheduler's pauses count by default (tiers.nvme.pause_after_failed_writes and
  // _reads): with a dead drive among several, the store takes it out no later than the pause would
  // stop every drive, and failures from then on are not counted against the others.
  static constexpr uint32_t kDefaultFailuresInARow = 8;

  // `failures_in_a_row` 0: no file is ever taken out of service.
  explicit NvmeFileHealth(uint32_t files = 0, uint32_t failures_in_a_row = kDefaultFailuresInARow)
      : files_(files), failures_in_a_row_(failures_in_a_row) {}

  // A request to `file` succeeded: its media errors in a row start again from none.
  void on_ok(uint32_t file) { files_.at(file).errors_in_a_row = 0; }
  // A request to `file` failed with a media error. True when this error takes the file out of
  // service (it was in service, reached failures_in_a_row, and another file is in service).
  bool on_media_error(uint32_t file) {
    File& f = files_.at(file);
    f.errors_in_a_row += 1;
    if (failures_in_a_row_ == 0 || f.out_of_service) return false;
    if (f.errors_in_a_row < failures_in_a_row_) return false;
    if (files_.size() - out_of_service_ <= 1) return false;  // the last file in service stays
    f.out_of_service = true;
    out_of_service_ += 1;
    return true;
  }
  bool in_service(uint32_t file) const { return !files_.at(file).out_of_service; }
  uint32_t errors_in_a_row(uint32_t file) const { return files_.at(file).errors_in_a_row; }
  uint32_t out_of_service() const { return out_of_service_; }
  uint32_t failures_in_a_row() const { return failures_in_a_row_; }

 private:
  struct File {
    uint32_t errors_in_a_row = 0;
    bool out_of_service = false;
  };
  std::vector<File> files_;
  uint32_t failures_in_a_row_ = kDefaultFailuresInARow;
  uint32_t out_of_service_ = 0;
};

}  // namespace kvtier
