#include "scheduler/engine_transfer_port.hpp"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace kvtier {
namespace {

// Weight of a new sample in the bandwidth average: recent enough to follow contention, smooth
// enough that one slow transfer does not flip compute-or-load decisions.
constexpr double kEwmaWeight = 0.05;

}  // namespace

EngineTransferPort::EngineTransferPort(TransferEngine& engine, BlockStore* store, EventLoop& loop,
                                       const PageFormat& host_format, const PageFormat& nvme_format,
                                       const std::array<LinkModel, kNumLinks>& configured,
                                       const std::array<LinkModel, kNumLinks>& prior)
    : engine_(engine),
      store_(store),
      loop_(loop),
      host_format_(host_format),
      nvme_format_(nvme_format),
      configured_(configured) {
  for (int i = 0; i < kNumLinks; ++i) {
    measured_[i].store(prior[i].bytes_per_second, std::memory_order_relaxed);
    latency_[i] = configured[i].bytes_per_second > 0 ? configured[i].latency : prior[i].latency;
  }
}

LinkModel EngineTransferPort::link_model(Link link) const {
  const int i = static_cast<int>(link);
  if (configured_[i].bytes_per_second > 0) return configured_[i];
  return LinkModel{measured_[i].load(std::memory_order_relaxed), latency_[i]};
}

void EngineTransferPort::record(Link link, uint64_t bytes, Nanos submitted, Nanos completed) {
  // Service time, not latency: a transfer queued behind others on the same link started being
  // served when the previous one finished, so time spent waiting in the queue is not counted as
  // slow transfer (with transfers in flight back to back, submit-to-completion would measure the
  // queue, and compute-or-load would then refuse loads that are in fact fast).
  const int i = static_cast<int>(link);
  Nanos prev = last_completion_[i].load(std::memory_order_relaxed);
  while (completed > prev &&
         !last_completion_[i].compare_exchange_weak(prev, completed, std::memory_order_relaxed)) {
  }
  const Nanos elapsed = completed - std::max(submitted, prev);
  if (elapsed <= 0 || bytes == 0) return;
  const double sample = static_cast<double>(bytes) / nanos_to_seconds(elapsed);
  auto& m = measured_[static_cast<int>(link)];
  double cur = m.load(std::memory_order_relaxed);
  const double next = cur <= 0 ? sample : cur + kEwmaWeight * (sample - cur);
  m.store(next, std::memory_order_relaxed);  // a lost update between racing samples is harmless
}

TransferOptions EngineTransferPort::options_for(Link link, uint64_t bytes, TransferDone done) {
  TransferOptions options;
  const Nanos submitted = clock_.now();
  options.on_complete = [this, link, bytes, submitted, done = std::move(done)](const Status& s) {
    if (s.ok()) record(link, bytes, submitted, clock_.now());
    loop_.post([done, s] { done(s); });
  };
  return options;
}

TransferOptions EngineTransferPort::read_options(uint64_t bytes, TransferDone done,
                                                 FramesReleased released) {
  TransferOptions options = options_for(Link::kNvmeToHost, bytes, std::move(done));
  options.on_buffers_released = [this, released = std::move(released)](const Status& s) {
    // After the completion's post (the loop runs in order); a read that succeeded holds nothing.
    if (!s.ok() && released) loop_.post(released);
  };
  return options;
}

Status EngineTransferPort::copy_pages(Link link, std::span<const FrameMove> moves,
                                      TransferDone done) {
  CopyDirection direction;
  if (link == Link::kHbmToHost) {
    direction = CopyDirection::kHbmToHost;
  } else if (link == Link::kHostToHbm) {
    direction = CopyDirection::kHostToHbm;
  } else {
    return invalid_argument("copy_pages takes the hbm<->host links, not " +
                            std::string(link_name(link)));
  }
  std::vector<FramePair> pairs;
  pairs.reserve(moves.size());
  for (const FrameMove& m : moves) pairs.push_back(FramePair{m.src, m.dst});
  KVTIER_ASSIGN_OR_RETURN(
      Transfer t,
      engine_.copy(direction, pairs,
                   options_for(link, moves.size() * host_page_bytes(), std::move(done))));
  t.detach();
  return ok_status();
}

Status EngineTransferPort::write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                                       TransferDone done) {
  KVTIER_ASSIGN_OR_RETURN(
      Transfer t, engine_.write_block(
                      key, host_frames,
                      options_for(Link::kHostToNvme, nvme_format_.block_bytes(), std::move(done))));
  t.detach();
  return ok_status();
}

Status EngineTransferPort::read_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                                      TransferDone done, FramesReleased released) {
  KVTIER_ASSIGN_OR_RETURN(
      Transfer t, engine_.read_block(key, host_frames,
                                     read_options(nvme_format_.block_bytes(), std::move(done),
                                                  std::move(released))));
  t.detach();
  return ok_status();
}

Status EngineTransferPort::read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame,
                                     TransferDone done, FramesReleased released) {
  KVTIER_ASSIGN_OR_RETURN(
      Transfer t,
      engine_.read_page(key, layer, host_frame,
                        read_options(nvme_page_bytes(), std::move(done), std::move(released))));
  t.detach();
  return ok_status();
}

Status EngineTransferPort::erase_block(const BlockKey& key) {
  if (store_ == nullptr) return unavailable("no nvme tier is configured");
  return store_->erase(key);
}

}  // namespace kvtier
