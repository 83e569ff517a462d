// SimTransferPort: the links between tiers as a model in virtual time (see transfer_port.hpp).
//
// Each link is one FIFO server: a transfer starts when the link is free, occupies it for
// bytes / bandwidth, and completes `latency` later (latency overlaps the next transfer, as DMA and
// NVMe queues pipeline). The NVMe "store" is the set of keys written and not erased, with an extent
// capacity, so reading a block never written fails as it would on disk. Failures can be injected
// (fail the k-th transfer on a link) to test the scheduler's error paths deterministically.
// Loop thread only; no bytes move. Completions are also recorded in a TransferStats, as the real
// transfer engine records them (bytes and latency of OK transfers, in virtual time), so a
// simulated run exports the same link metrics; those atomics may be read from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "kvtier/transfer_stats.hpp"
#include "kvtier/types.hpp"
#include "scheduler/sim_event_loop.hpp"
#include "scheduler/transfer_port.hpp"

namespace kvtier {

struct SimLinkSpec {
  std::array<LinkModel, kNumLinks> links{};  // indexed by Link
  uint64_t nvme_extents = 0;                 // blocks the store holds
  uint64_t host_page_bytes = 0;              // a page on the HBM<->host links; 0: as computed
  uint64_t nvme_page_bytes = 0;              // a page on the NVMe links; 0: as computed
};

struct SimLinkCounters {
  uint64_t transfers = 0;
  uint64_t bytes = 0;
  Nanos busy = 0;  // time the link spent moving bytes
};

class SimTransferPort final : public TransferPort {
 public:
  SimTransferPort(SimEventLoop& loop, const Geometry& geometry, const SimLinkSpec& spec);

  Status copy_pages(Link link, std::span<const FrameMove> moves, TransferDone done) override;
  Status write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                     TransferDone done) override;
  Status read_block(const BlockKey& key, std::span<const uint32_t> host_frames, TransferDone done,
                    FramesReleased released) override;
  Status read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame, TransferDone done,
                   FramesReleased released) override;
  Status erase_block(const BlockKey& key) override;
  uint64_t nvme_retired_extents() const override { return retired_extents_; }
  std::vector<BlockKey> take_lost_nvme_blocks() override {
    std::vector<BlockKey> lost;
    lost.swap(lost_);
    return lost;
  }
  LinkModel link_model(Link link) const override { return spec_.links[static_cast<int>(link)]; }
  uint64_t host_page_bytes() const override {
    return spec_.host_page_bytes != 0 ? spec_.host_page_bytes : geometry_.page_bytes();
  }
  uint64_t nvme_page_bytes() const override {
    return spec_.nvme_page_bytes != 0 ? spec_.nvme_page_bytes : geometry_.page_bytes();
  }

  // The next `count` transfers on `link` complete with kIoError (after their modeled time).
  void fail_next(Link link, uint32_t count) { fail_next_[static_cast<int>(link)] += count; }
  // The next `count` NVMe writes land on bad sectors: each fails with kIoError and retires its
  // extent (the store holds one block fewer) while fewer than max_retired_extents are, as the
  // real store does after a media error.
  void fail_next_writes_on_bad_extents(uint32_t count) { bad_extent_writes_ += count; }
  // The next NVMe read (of a block or a page) lands on a bad sector: it fails with kIoError, and
  // the block's extent is retired when the block is erased (within the same cap).
  void fail_next_read_on_a_bad_extent() { bad_extent_reads_ += 1; }
  // The next `count` NVMe reads hang: each takes its modeled time (the I/O timeout, as far as the
  // scheduler can tell), then fails with kDeadlineExceeded, abandoned, and its frames are released
  // only at answer_hung_reads(), as the real store does with reads a hung drive holds.
  void hang_next_reads(uint32_t count) { hang_reads_ += count; }
  // The hung drive answers: the frames of every read it held are released (posted to the loop).
  void answer_hung_reads();
  std::size_t hung_reads() const { return hung_releases_.size(); }
  // A dead drive: these blocks leave the store (take_lost_nvme_blocks lists them) and `extents`
  // extents are retired with it, as the real store does when it takes a file out of service.
  void lose_nvme_blocks(std::span<const BlockKey> keys, uint64_t extents) {
    for (const BlockKey& key : keys) {
      if (on_nvme_.erase(key) != 0) lost_.push_back(key);
    }
    retired_extents_ += extents;
  }
  // The dead drive answers again and the store readmits it: `extents` extents are back in
  // service, as the real store does after a probe.
  void readmit_nvme_extents(uint64_t extents) {
    retired_extents_ -= std::min(extents, retired_extents_);
  }
  // A dead drive holding about one block in `one_in`, drawn with `rng`; no extent is retired.
  template <typename Rng>
  void lose_some_nvme_blocks(Rng& rng, uint32_t one_in) {
    std::vector<BlockKey> keys;
    for (const BlockKey& key : on_nvme_) {
      if (rng() % one_in == 0) keys.push_back(key);
    }
    lose_nvme_blocks(keys, 0);
  }
  const SimLinkCounters& counters(Link link) const { return counters_[static_cast<int>(link)]; }
  const TransferStats& transfer_stats() const { return stats_; }
  std::size_t nvme_blocks() const { return on_nvme_.size(); }
  bool on_nvme(const BlockKey& key) const { return on_nvme_.contains(key); }
  // Clears the NVMe contents (a "restart" that lost the disk) or keeps them (a restart that kept
  // it).
  void forget_nvme() { on_nvme_.clear(); }
  // Puts `key` on NVMe behind the scheduler's back (a block an earlier runtime wrote that this one
  // did not adopt): writing it again is kAlreadyExists, as the real store answers.
  void store_on_nvme(const BlockKey& key) { on_nvme_.insert(key); }

 private:
  // `fail`: this transfer fails whatever fail_next says (it does not consume fail_next).
  void schedule(Link link, uint64_t bytes, TransferDone done, std::function<void()> on_success,
                bool fail = false);
  // A read of `key`, failing on a bad sector or hanging when one is armed; `released` runs after
  // `done`, or at answer_hung_reads for a read that hangs.
  void schedule_read(const BlockKey& key, uint64_t bytes, TransferDone done,
                     FramesReleased released);
  // One more extent retired, unless max_retired_extents are already.
  void retire_an_extent();

  SimEventLoop& loop_;
  const Geometry geometry_;
  const SimLinkSpec spec_;
  std::array<Nanos, kNumLinks> busy_until_{};
  uint32_t hang_reads_ = 0;
  std::vector<FramesReleased> hung_releases_;  // of reads abandoned, until the drive answers
  std::array<uint32_t, kNumLinks> fail_next_{};
  uint32_t bad_extent_writes_ = 0;
  uint32_t bad_extent_reads_ = 0;
  uint64_t retired_extents_ = 0;
  // Blocks a read failed on a bad sector for: their extents are retired when they are erased.
  std::unordered_set<BlockKey, BlockKeyHash> on_bad_extents_;
  std::array<SimLinkCounters, kNumLinks> counters_{};
  TransferStats stats_;
  std::unordered_set<BlockKey, BlockKeyHash> on_nvme_;
  std::unordered_set<BlockKey, BlockKeyHash> writing_;
  std::vector<BlockKey> lost_;
};

}  // namespace kvtier
