// EngineTransferPort: the TransferPort over the real tiers (tiers/transfer_engine.hpp).
//
// Each call submits to the TransferEngine with a completion callback that posts the caller's
// TransferDone to the scheduler's EventLoop, then detaches the handle: the engine keeps the
// transfer alive until it completes, and the loop learns of it as a posted task (Asio's post wakes
// the loop's reactor through its eventfd). Link models come from the configuration when it names a
// bandwidth, else from an estimate measured over completed transfers (an exponential moving
// average of bytes per service time: from when the link could start serving a transfer — its
// submission, or the previous completion — to its completion), so compute-or-load decisions
// follow what the hardware actually does, not how long transfers queued.
#pragma once

#include <array>
#include <atomic>

#include "kvtier/types.hpp"
#include "scheduler/event_loop.hpp"
#include "scheduler/transfer_port.hpp"
#include "tiers/transfer_engine.hpp"

namespace kvtier {

class EngineTransferPort final : public TransferPort {
 public:
  // `configured` links with bytes_per_second > 0 are used as given; the others are measured,
  // starting from `prior`. `store` (null: no NVMe tier) is the engine's block store, for erase;
  // `host_format` and `nvme_format` say how those tiers hold pages (what their links move).
  // The port must outlive every transfer it submitted (the runtime drains them at shutdown).
  EngineTransferPort(TransferEngine& engine, BlockStore* store, EventLoop& loop,
                     const PageFormat& host_format, const PageFormat& nvme_format,
                     const std::array<LinkModel, kNumLinks>& configured,
                     const std::array<LinkModel, kNumLinks>& prior);

  Status copy_pages(Link link, std::span<const FrameMove> moves, TransferDone done) override;
  Status write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                     TransferDone done) override;
  Status read_block(const BlockKey& key, std::span<const uint32_t> host_frames, TransferDone done,
                    FramesReleased released) override;
  Status read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame, TransferDone done,
                   FramesReleased released) override;
  Status erase_block(const BlockKey& key) override;
  uint64_t nvme_retired_extents() const override {
    return store_ != nullptr ? store_->retired_blocks() : 0;
  }
  std::vector<BlockKey> take_lost_nvme_blocks() override {
    return store_ != nullptr ? store_->take_lost_blocks() : std::vector<BlockKey>{};
  }
  LinkModel link_model(Link link) const override;
  uint64_t host_page_bytes() const override { return host_format_.page_bytes(); }
  uint64_t nvme_page_bytes() const override { return nvme_format_.page_bytes(); }

 private:
  TransferOptions options_for(Link link, uint64_t bytes, TransferDone done);
  // A read's options: options_for's, and, for a read that failed, `released` posted to the loop
  // when the store lets the frames go (so a read the drive holds past its I/O timeout completes
  // then, kDeadlineExceeded).
  TransferOptions read_options(uint64_t bytes, TransferDone done, FramesReleased released);
  void record(Link link, uint64_t bytes, Nanos submitted, Nanos completed);

  TransferEngine& engine_;
  BlockStore* store_;
  EventLoop& loop_;
  const PageFormat host_format_;
  const PageFormat nvme_format_;
  const std::array<LinkModel, kNumLinks> configured_;
  // Measured bandwidth in bytes/s per link, stored as double bits (atomic: engine threads record).
  std::array<std::atomic<double>, kNumLinks> measured_{};
  std::array<Nanos, kNumLinks> latency_{};
  // When the latest transfer on each link completed (steady clock), for service-time samples.
  std::array<std::atomic<Nanos>, kNumLinks> last_completion_{};
  SteadyClock clock_;
};

}  // namespace kvtier
