#include "scheduler/copy_batcher.hpp"

#include <memory>
#include <utility>

namespace kvtier {

CopyBatcher::CopyBatcher(EventLoop& loop, LinkQueues& links, TransferPort& port, uint32_t max_pages,
                         LoopTask after_batch)
    : loop_(loop),
      links_(links),
      port_(port),
      max_pages_(max_pages > 0 ? max_pages : 1),
      after_batch_(std::move(after_batch)) {}

void CopyBatcher::copy_page(Link link, TransferPriority priority, FrameMove move,
                            TransferDone done) {
  if (priority != TransferPriority::kWriteBack) {
    submit(link, priority, Batch{{move}, {std::move(done)}});
    return;
  }
  Batch& open = open_[static_cast<std::size_t>(link)];
  open.moves.push_back(move);
  open.done.push_back(std::move(done));
  if (open.moves.size() >= max_pages_) {
    submit(link, priority, std::exchange(open, Batch{}));
    return;
  }
  if (!flush_posted_) {
    flush_posted_ = true;
    loop_.post([this] { flush(); });
  }
}

void CopyBatcher::flush() {
  flush_posted_ = false;
  for (Link link : kAllLinks) {
    Batch& open = open_[static_cast<std::size_t>(link)];
    if (!open.moves.empty()) {
      submit(link, TransferPriority::kWriteBack, std::exchange(open, Batch{}));
    }
  }
}

void CopyBatcher::submit(Link link, TransferPriority priority, Batch batch) {
  const uint64_t bytes = batch.moves.size() * port_.host_page_bytes();
  auto pages = std::make_shared<Batch>(std::move(batch));
  links_.enqueue(link, priority, bytes, [this, link, pages](std::function<void()> finished) {
    start(link, pages, std::move(finished));
  });
}

void CopyBatcher::start(Link link, const std::shared_ptr<Batch>& pages,
                        std::function<void()> finished) {
  auto on_done = [this, link, pages, finished](const Status& s) {
    finished();
    if (s.code() == StatusCode::kInvalidArgument && pages->moves.size() > 1) {
      // One page the destination cannot hold refuses the whole copy: find it page by page (the
      // link's cap was given back above; these copies are not queued behind it again).
      for (std::size_t i = 0; i < pages->moves.size(); ++i) {
        TransferDone alone_done = [this, done = pages->done[i]](const Status& r) {
          done(r);
          if (after_batch_) after_batch_();
        };
        Status alone = port_.copy_pages(link, std::span(&pages->moves[i], 1), alone_done);
        if (!alone.ok()) alone_done(alone);
      }
      return;
    }
    for (const TransferDone& done : pages->done) done(s);
    if (after_batch_) after_batch_();
  };
  Status submitted = port_.copy_pages(link, pages->moves, on_done);
  if (!submitted.ok()) on_done(submitted);
}

}  // namespace kvtier
