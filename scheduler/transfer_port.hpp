// TransferPort: how the scheduler moves bytes, without knowing whether they are real.
//
// The scheduler plans moves by frame index and block key and learns of their completion through a
// callback that always runs on its EventLoop (never on an engine thread, never inside the submit
// call). Two implementations:
//   - EngineTransferPort: the real tiers (tiers/transfer_engine.hpp): CUDA streams or memcpy
//     workers for HBM<->host, io_uring for host<->NVMe. Engine callbacks post to the loop.
//   - SimTransferPort: a model of the links (bandwidth, latency, one FIFO per link) in the virtual
//     time of a SimEventLoop; no bytes move. This is what lets the benchmark run a GPU server's
//     hour of traffic on a CPU, and what makes overlap and stall tests deterministic.
// A submit error (bad frame, unknown key, store full) is returned by the call and nothing starts;
// the callback then never runs. I/O errors after submission arrive as the callback's Status.
// `link_model()` is the bandwidth and latency the scheduler plans with (compute-or-load,
// deadlines).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "kvtier/transfer_stats.hpp"
#include "scheduler/clock.hpp"

namespace kvtier {

struct FrameMove {
  uint32_t src = 0;  // frame in the source tier
  uint32_t dst = 0;  // frame in the destination tier
};

// Runs on the scheduler's loop with the transfer's final Status.
using TransferDone = std::function<void(const Status&)>;
// Runs on the scheduler's loop, after the TransferDone of a read that failed, once the read no
// longer writes its host frames: at once, except for a read abandoned while its drive holds it
// (an NVMe read past tiers.nvme.io_timeout_ms: its TransferDone had kDeadlineExceeded), when the
// drive answers. The frames may be reused only then. Never runs for a read that succeeded (its
// frames hold its pages) or when the submit call fails.
using FramesReleased = std::function<void()>;

struct LinkModel {
  double bytes_per_second = 0.0;  // sustained bandwidth; 0 = unknown (treated as infinite)
  Nanos latency = 0;              // fixed cost per transfer
  // Time to move `bytes` over an idle link.
  Nanos transfer_time(uint64_t bytes) const {
    if (bytes_per_second <= 0.0) return latency;
    return latency + static_cast<Nanos>(static_cast<double>(bytes) / bytes_per_second * 1e9);
  }
};

class TransferPort {
 public:
  virtual ~TransferPort() = default;

  // HBM->host (`link` kHbmToHost) or host->HBM (kHostToHbm) page copies, host_page_bytes each.
  virtual Status copy_pages(Link link, std::span<const FrameMove> moves, TransferDone done) = 0;
  // host->NVMe: one block from its `layers` host frames (one per layer, in layer order).
  virtual Status write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                             TransferDone done) = 0;
  // NVMe->host: the whole block, or one layer's page.
  virtual Status read_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                            TransferDone done, FramesReleased released) = 0;
  virtual Status read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame,
                           TransferDone done, FramesReleased released) = 0;
  // Forgets a block on NVMe (frees its extent). Synchronous; the store does no I/O for it.
  virtual Status erase_block(const BlockKey& key) = 0;

  // Extents the NVMe store has retired after media errors (BlockStore::retired_blocks); it grows
  // after the failed read or write that retired one, before that transfer's callback runs.
  virtual uint64_t nvme_retired_extents() const = 0;
  // Blocks the NVMe store dropped on its own since the last call (BlockStore::take_lost_blocks: a
  // dead drive took them). Listed before the callback of the transfer that took the drive out
  // runs, or of a write that landed on it meanwhile.
  virtual std::vector<BlockKey> take_lost_nvme_blocks() = 0;

  virtual LinkModel link_model(Link link) const = 0;
  // Bytes one page moves over the HBM<->host links, in the host tier's PageFormat (fp8 and its
  // scales when tiers.host.kv_dtype is fp8_e4m3; the page as computed otherwise).
  virtual uint64_t host_page_bytes() const = 0;
  // Bytes one page moves over the NVMe links, in the NVMe tier's PageFormat (half of a bf16 page
  // plus its scales when tiers.nvme.kv_dtype is fp8_e4m3); a block moves layers times this.
  virtual uint64_t nvme_page_bytes() const = 0;
};

}  // namespace kvtier
