// NvmeHealth: whether one direction of NVMe I/O (writes, or reads) is used, judged by how its
// I/Os end. The scheduler keeps one for each.
//
// One failure is no reason to stop: a failed write refuses its block, a failed read loses its
// block, and the next one is tried. A disk that fails every I/O is: each failed write costs a
// transfer, a host frame staged for nothing and a block that must stay in memory; each failed
// read costs the step that needed it (it fails with the read's error) and a block recomputed. So
// `after_failures` failures in a row, with no success between them, pause that direction for
// `first_pause`. When the pause is over the I/Os resume, and the first to end decides: a success
// ends the outage, a failure pauses again for twice as long, up to `longest_pause`. I/Os already
// in flight when a pause begins end as they will; their failures do not lengthen it.
//
// Plain state on the scheduler's loop: the scheduler calls these as its I/Os end and as its pause
// timers fire, keeps the timers, and carries the decision into its plans
// (scheduler_nvme_failures.cpp says what each pause changes).
#pragma once

#include <cstdint>
#include <optional>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "scheduler/clock.hpp"

namespace kvtier {

struct NvmePauseOptions {
  uint32_t after_failures = 8;  // failures in a row that pause; 0 = never pause
  Nanos first_pause = kNanosPerSecond;
  Nanos longest_pause = 300 * kNanosPerSecond;
};

// Whether a failed write says something of the disk (an I/O error, a full device, a drive that
// left it unanswered past tiers.nvme.io_timeout_ms): not a block NVMe cannot encode (fp8 and NaN
// or inf: kInvalidArgument), not a write cancelled at shutdown, not one to a drive the store has
// taken out of service (kUnavailable: the drives left in service are not in question).
inline bool is_disk_write_failure(const Status& written) {
  return !written.ok() && written.code() != StatusCode::kInvalidArgument &&
         written.code() != StatusCode::kCancelled && written.code() != StatusCode::kUnavailable;
}

// Whether a failed read says something of the disk: an I/O error, bytes that came back wrong
// (a checksum or a header that does not match), or a drive that left requests unanswered past
// tiers.nvme.io_timeout_ms (kDeadlineExceeded: the store refuses reads from it until it answers).
// Not a read cancelled at shutdown, nor one of a block that left NVMe before its read started,
// nor one from a drive the store has taken out of service (kUnavailable).
inline bool is_disk_read_failure(const Status& read) {
  return read.code() == StatusCode::kIoError || read.code() == StatusCode::kDataLoss ||
         read.code() == StatusCode::kDeadlineExceeded;
}

// From tiers.nvme.pause_after_failed_writes, or pause_after_failed_reads, and pause_ms (both
// directions): the longest pause is 5 minutes, or the first when that is longer.
NvmePauseOptions nvme_write_pause_options(const NvmeTierConfig& config);
NvmePauseOptions nvme_read_pause_options(const NvmeTierConfig& config);

class NvmeHealth {
 public:
  explicit NvmeHealth(const NvmePauseOptions& options) : options_(options) {}

  // Whether I/Os in this direction may be planned now.
  bool usable() const { return !paused_; }
  // An I/O ended well: the failures in a row start again from none. True when it ends an outage
  // (paused since the last success): the disk works again.
  bool on_ok();
  // An I/O failed for a reason of the disk's. When this failure pauses the direction, returns for
  // how long; the caller arms a timer that calls resume().
  std::optional<Nanos> on_failed();
  // The pause is over: I/Os may go again; the next failure before a success pauses again.
  void resume() { paused_ = false; }
  // Failures in a row so far.
  uint32_t failures_in_a_row() const { return failures_in_a_row_; }

 private:
  NvmePauseOptions options_;
  uint32_t failures_in_a_row_ = 0;
  bool paused_ = false;
  Nanos last_pause_ = 0;  // 0: no pause since the last success
};

}  // namespace kvtier
