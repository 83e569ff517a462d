// TransferEngine: every byte that moves between tiers — HBM<->host through a copy engine,
// host<->NVMe through the block store — submitted by frame index and block key, completed
// asynchronously through Transfer handles (tiers/transfer.hpp), counted in one TransferStats.
//
// HBM<->host: `copy` takes (src frame, dst frame) pairs of one direction. It coalesces runs of
// consecutive frames on both sides into single copies (fewer, larger DMA), then hands the job to
// the CUDA engine (one stream per direction, event per transfer, batched cudaMemcpyBatchAsync) or,
// with emulated HBM, to the host engine (a memcpy worker per direction, optionally throttled to
// tiers.hbm.link_gbps). Hazards on reused frames are tracked here: for every HBM and host frame the
// engine remembers the last job of each direction that touched it, and a new job waits (on the GPU,
// or on the worker) for the other direction's last job on any of its frames. So "copy frame 7 out,
// then copy something else into frame 7" is safe without the caller waiting in between. Within one
// direction jobs run in submission order. The caller still owns frame lifetimes: a frame must not
// be freed while a transfer that touches it is incomplete, and host frames handed to the NVMe calls
// must not be the target of an incomplete copy (those calls do not join the hazard tracking).
//
// host<->NVMe: write_block/read_block/read_page translate host frames to addresses and forward to
// the BlockStore; its I/O threads complete them.
//
// Lock order: hazard_mu_ (this class) -> the copy engine's queue mutex; neither is held across a
// driver call, a syscall that blocks, or a callback. Completion callbacks run on engine threads
// (see transfer.hpp); completion_fd() becomes readable whenever any transfer completes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/transfer_stats.hpp"
#include "tiers/block_store.hpp"
#include "tiers/copy_engine.hpp"
#include "tiers/hbm_arena.hpp"
#include "tiers/host_pool.hpp"

namespace kvtier {

struct FramePair {
  uint32_t src = 0;
  uint32_t dst = 0;
};

struct TransferEngineOptions {
  double link_gbps = 0.0;  // emulated HBM only: throttle copies to this bandwidth (GB/s)
  std::shared_ptr<TransferStats> stats;          // null: the engine makes one
  std::shared_ptr<CompletionNotifier> notifier;  // null: the engine makes one
  // Tests: replace the copy engine chosen from the HBM arena (e.g. a CUDA engine over a fake).
  std::unique_ptr<CopyEngine> copy_engine;
};

class TransferEngine {
 public:
  // `hbm`, `host` and `store` (may be null: no NVMe tier) must outlive the engine. The store should
  // share the engine's stats and notifier (TierStack wires this).
  static Result<std::unique_ptr<TransferEngine>> create(HbmArena& hbm, HostPool& host,
                                                        BlockStore* store,
                                                        TransferEngineOptions options);
  // Waits for every copy it queued (handles stay valid; their transfers complete).
  ~TransferEngine();

  // HBM->host (pairs: hbm frame -> host frame) or host->HBM (host frame -> hbm frame). Copies
  // page_bytes per page; when the host tier holds fp8 (tiers.host.kv_dtype) each page is encoded
  // on the way out and decoded on the way in, and the transfer counts the encoded bytes.
  // kInvalidArgument for an empty list or a frame past its arena; nothing starts then.
  Result<Transfer> copy(CopyDirection direction, std::span<const FramePair> pages,
                        TransferOptions options = {});

  // Host <-> NVMe. `host_frames` holds one frame per layer.
  Result<Transfer> write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                               TransferOptions options = {});
  Result<Transfer> read_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                              TransferOptions options = {});
  Result<Transfer> read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame,
                             TransferOptions options = {});

  int completion_fd() const { return notifier_->fd(); }
  const std::shared_ptr<CompletionNotifier>& notifier() const { return notifier_; }
  TransferStats& stats() const { return *stats_; }
  const std::shared_ptr<TransferStats>& shared_stats() const { return stats_; }
  std::string_view copy_engine_name() const { return copy_->name(); }

 private:
  TransferEngine(HbmArena& hbm, HostPool& host, BlockStore* store,
                 std::shared_ptr<TransferStats> stats, std::shared_ptr<CompletionNotifier> notifier,
                 std::unique_ptr<CopyEngine> copy);

  Result<std::vector<std::byte*>> host_addresses(std::span<const uint32_t> frames) const;

  HbmArena& hbm_;
  HostPool& host_;
  BlockStore* store_;
  std::shared_ptr<TransferStats> stats_;
  std::shared_ptr<CompletionNotifier> notifier_;
  std::unique_ptr<CopyEngine> copy_;

  std::mutex hazard_mu_;
  uint64_t next_seq_[2] = {0, 0};       // guarded by hazard_mu_
  std::vector<uint64_t> hbm_last_[2];   // per HBM frame, per direction; guarded by hazard_mu_
  std::vector<uint64_t> host_last_[2];  // per host frame, per direction; guarded by hazard_mu_
};

}  // namespace kvtier
