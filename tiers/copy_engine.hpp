// CopyEngine: moves page bytes between the HBM arena and the host pool, one FIFO per direction.
//
// Two implementations: HostCopyEngine (emulated HBM: one memcpy worker per direction, optionally
// throttled to a link bandwidth so runs model PCIe) and CudaCopyEngine (one CUDA stream per
// direction, an event per transfer, batched async copies). The TransferEngine owns one of them,
// coalesces a transfer's pages into as few contiguous segments as the frame indices allow, and
// assigns each job its sequence number.
//
// Ordering contract, the same for both: jobs of one direction start and complete in `seq` order
// (seq = 1, 2, 3... per direction, submitted in that order). A job with `after_other_seq` = s > 0
// starts only once job s of the other direction has completed — that is how a frame being copied
// out (HBM->host) is not overwritten by a copy in (host->HBM) submitted later, and vice versa,
// without the caller waiting in between (the per-frame hazard bookkeeping is in TransferEngine).
// Dependencies only point at earlier submissions, so the oldest incomplete job never waits and the
// two FIFOs cannot deadlock. A job whose state asks to cancel before it starts completes with
// kCancelled and copies nothing; it still advances its direction's sequence.
//
// Re-encoding: when the host tier holds pages in another format (tiers.host.kv_dtype: fp8_e4m3)
// the job carries that format and every segment is one page (frames of the two tiers differ in
// size, so nothing coalesces): HBM->host encodes each page into its host frame, host->HBM decodes.
// The host engine runs the codec on its worker; the CUDA engine launches the codec kernels on the
// direction's stream, reading and writing the pinned host frames through their device mapping.
// A page that cannot be encoded (NaN or inf) fails its job, naming the HBM frame; the others in
// the job are encoded, and the caller frees the host frames of a failed job as for any failure.
//
// Threads: `submit` is called under the TransferEngine's hazard mutex (so seq order is queue
// order) and only queues — it makes no driver call and never blocks. Each engine's own threads
// run the copies and complete the states (callbacks run there).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"
#include "tiers/device_api.hpp"
#include "tiers/transfer.hpp"

namespace kvtier {

enum class CopyDirection : uint8_t { kHbmToHost = 0, kHostToHbm = 1 };

constexpr CopyDirection other_direction(CopyDirection d) {
  return d == CopyDirection::kHbmToHost ? CopyDirection::kHostToHbm : CopyDirection::kHbmToHost;
}
constexpr Link copy_link(CopyDirection d) {
  return d == CopyDirection::kHbmToHost ? Link::kHbmToHost : Link::kHostToHbm;
}
static_assert(other_direction(CopyDirection::kHbmToHost) == CopyDirection::kHostToHbm);
static_assert(copy_link(CopyDirection::kHostToHbm) == Link::kHostToHbm);

struct CopyJob {
  CopyDirection direction = CopyDirection::kHbmToHost;
  uint64_t seq = 0;              // this job's number in its direction (1, 2, ...)
  uint64_t after_other_seq = 0;  // 0, or the other direction's job that must complete first
  std::vector<CopySegment> segments;
  uint32_t pages = 0;
  void* wait_device_event = nullptr;  // CUDA only: the stream waits on it first
  std::shared_ptr<TransferState> state;
  // Set when host frames hold pages in this format (it encodes): one page per segment, `bytes`
  // the page as computed; hbm_frames[i] is segment i's HBM frame, for error messages.
  std::optional<PageFormat> host_format;
  std::vector<uint32_t> hbm_frames;
};

// After an encoding job has run: kInvalidArgument naming the HBM frames whose pages held NaN or
// inf (their host frames carry a NaN scale), or OK. Reads the host frames; OK for other jobs.
Status refused_pages_status(const CopyJob& job);

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual std::string_view name() const = 0;
  // Queues a job (see the ordering contract). Fails only when the engine is shutting down.
  virtual Status submit(CopyJob job) = 0;
  // The highest seq of `direction` that has completed (all earlier ones have too).
  virtual uint64_t completed(CopyDirection direction) const = 0;
};

struct HostCopyOptions {
  double link_gbps = 0.0;  // 0: unthrottled
};

// Emulated HBM: memcpy on worker threads.
Result<std::unique_ptr<CopyEngine>> make_host_copy_engine(const HostCopyOptions& options,
                                                          std::shared_ptr<TransferStats> stats);
// A GPU: streams and events of `device`.
Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(std::shared_ptr<DeviceApi> device,
                                                          std::shared_ptr<TransferStats> stats);

}  // namespace kvtier
