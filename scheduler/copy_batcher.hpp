// CopyBatcher: background page copies between HBM and host memory, gathered into batches.
//
// A watermark plan demotes hundreds of blocks at once, a page per layer each, and every page used
// to be its own link-queue job, its own copy_pages call and its own completion posted back to the
// loop: per page, a std::function chain, a submission to the copy engine and a loop task, on the
// thread that ran the plan — often an engine thread inside end_layer. Write-through copies every
// page of a step's completed blocks down as the step ends: as many pages at once. The batcher
// collects the write-back copies one loop turn starts on a link and submits them as jobs of up to
// `max_pages` pages: one queue entry, one copy_pages call and one completion per batch. A batch
// is closed when full, or at the end of the loop turn (a task posted with its first page), so a
// turn's copies reach the link together and none waits for pages that will not come.
//
// Copies at a higher priority (a step's demotions trading frames in full memory, loads) are
// submitted alone, at once: a step waits on each, and the scheduler's trades in memory full of
// pages that cannot leave rely on pages completing one by one (grouped, the random-workload
// simulation found steps that livelocked or stalled).
//
// Each page keeps its own completion: the batch's status is handed to every page's `done`, then
// `after_batch` runs once, for the work the pages' completions leave to the batch (the scheduler
// syncs each block's policy membership and serves frame waiters once per batch, not per page). A
// batch refused with kInvalidArgument (a host tier in fp8 cannot encode a page holding NaN or inf)
// is retried page by page, so only the page the tier cannot hold is refused. Loop thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "scheduler/event_loop.hpp"
#include "scheduler/link_queues.hpp"
#include "scheduler/transfer_port.hpp"

namespace kvtier {

class CopyBatcher {
 public:
  // `loop`, `links` and `port` must outlive the batcher and every batch it submitted.
  CopyBatcher(EventLoop& loop, LinkQueues& links, TransferPort& port, uint32_t max_pages,
              LoopTask after_batch);

  // Copies one page over `link` (kHbmToHost or kHostToHbm) at `priority`; `done` runs once, on
  // the loop, when its batch completes or fails, before the batch's `after_batch`.
  void copy_page(Link link, TransferPriority priority, FrameMove move, TransferDone done);

  // Submits the open batches now (the task posted for the turn calls it).
  void flush();
  // No page waits in an open batch (what was submitted is the link queues').
  bool idle() const { return !flush_posted_; }

 private:
  struct Batch {
    std::vector<FrameMove> moves;
    std::vector<TransferDone> done;
  };
  void submit(Link link, TransferPriority priority, Batch batch);
  // Submits the batch to the port as one copy; `finished` tells the link queue it ended.
  void start(Link link, const std::shared_ptr<Batch>& pages, std::function<void()> finished);

  EventLoop& loop_;
  LinkQueues& links_;
  TransferPort& port_;
  const uint32_t max_pages_;
  const LoopTask after_batch_;
  std::array<Batch, kNumLinks> open_;  // per link: the write-back batch of this loop turn
  bool flush_posted_ = false;
};

}  // namespace kvtier
