// NvmeWriteHealth: whether blocks are sent to NVMe, judged by how the writes there end.
//
// A failed write refuses its block (the scheduler does not send that block again), and the next
// block is tried: one bad write is no reason to stop writing. A disk that fails every write is:
// each failure costs a transfer, a host frame staged for nothing and a block that must stay in
// memory, and the store's refusals pile up. So `after_failed_writes` failures in a row, with no
// write succeeding between them, pause writing to NVMe for `first_pause`. While paused the
// scheduler plans as if there were no NVMe tier to write to (blocks in use stay in memory, cached
// blocks leaving host memory are dropped); copies already on NVMe are still read. When the pause
// is over writes resume, and the first to end decides: a success ends the outage, a failure
// pauses again for twice as long, up to `longest_pause`. Writes already in flight when a pause
// begins end as they will; their failures do not lengthen it. When an outage ends, the blocks its
// failures refused may be written again (the scheduler lifts those refusals).
//
// Plain state on the scheduler's loop: the scheduler calls these as its writes end and as its
// pause timer fires, and keeps the timer itself.
#pragma once

#include <cstdint>
#include <optional>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "scheduler/clock.hpp"

namespace kvtier {

struct NvmeWritePauseOptions {
  uint32_t after_failed_writes = 8;  // failures in a row that pause writing; 0 = never pause
  Nanos first_pause = kNanosPerSecond;
  Nanos longest_pause = 300 * kNanosPerSecond;
};

// Whether a failed write says something of the disk: not a block NVMe cannot encode (fp8 and NaN
// or inf: kInvalidArgument), not a write cancelled at shutdown.
inline bool is_disk_failure(const Status& written) {
  return !written.ok() && written.code() != StatusCode::kInvalidArgument &&
         written.code() != StatusCode::kCancelled;
}

// From tiers.nvme.pause_after_failed_writes and pause_ms: the longest pause is 5 minutes, or the
// first when that is longer.
NvmeWritePauseOptions nvme_pause_options(const NvmeTierConfig& config);

class NvmeWriteHealth {
 public:
  explicit NvmeWriteHealth(const NvmeWritePauseOptions& options) : options_(options) {}

  // Whether blocks may be sent to NVMe now.
  bool writable() const { return !paused_; }
  // A write ended well: the failures in a row start again from none. True when it ends an outage
  // (writing paused since the last success): the disk works again.
  bool on_write_ok();
  // A write failed for a reason of the disk's (not of the block's content). When this failure
  // pauses writing, returns for how long; the caller arms a timer that calls resume().
  std::optional<Nanos> on_write_failed();
  // The pause is over: writes may go again; the next failure before a success pauses again.
  void resume() { paused_ = false; }
  // Failures in a row so far, and pauses begun since creation.
  uint32_t failures_in_a_row() const { return failures_in_a_row_; }
  uint64_t pauses() const { return pauses_; }

 private:
  NvmeWritePauseOptions options_;
  uint32_t failures_in_a_row_ = 0;
  bool paused_ = false;
  Nanos last_pause_ = 0;  // 0: no pause since the last success
  uint64_t pauses_ = 0;
};

}  // namespace kvtier
