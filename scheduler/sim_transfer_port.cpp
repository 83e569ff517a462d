#include "scheduler/sim_transfer_port.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "tiers/extent_allocator.hpp"

namespace kvtier {

SimTransferPort::SimTransferPort(SimEventLoop& loop, const Geometry& geometry,
                                 const SimLinkSpec& spec)
    : loop_(loop), geometry_(geometry), spec_(spec) {}

void SimTransferPort::schedule(Link link, uint64_t bytes, TransferDone done,
                               std::function<void()> on_success, bool fail) {
  const int i = static_cast<int>(link);
  const LinkModel& model = spec_.links[i];
  const Nanos now = loop_.now();
  const Nanos occupancy = model.transfer_time(bytes) - model.latency;
  const Nanos start = std::max(now, busy_until_[i]);
  busy_until_[i] = start + occupancy;
  const Nanos finish = busy_until_[i] + model.latency;
  counters_[i].transfers += 1;
  counters_[i].bytes += bytes;
  counters_[i].busy += occupancy;
  if (!fail && fail_next_[i] > 0) {
    --fail_next_[i];
    fail = true;
  }
  LinkStats& stats = stats_.link(link);
  loop_.post_after(finish - now, [link, fail, bytes, latency = finish - now, &stats,
                                  done = std::move(done), on_success = std::move(on_success)] {
    if (fail) {
      stats.errors.fetch_add(1, std::memory_order_relaxed);
      done(io_error("injected failure on link " + std::string(link_name(link))));
      return;
    }
    stats.bytes.fetch_add(bytes, std::memory_order_relaxed);
    stats.ops.fetch_add(1, std::memory_order_relaxed);
    stats.latency.record(static_cast<uint64_t>(latency));
    if (on_success) on_success();
    done(ok_status());
  });
}

Status SimTransferPort::copy_pages(Link link, std::span<const FrameMove> moves, TransferDone done) {
  if (link != Link::kHbmToHost && link != Link::kHostToHbm) {
    return invalid_argument("copy_pages takes the hbm<->host links, not " +
                            std::string(link_name(link)));
  }
  if (moves.empty()) return invalid_argument("copy_pages with no pages");
  schedule(link, moves.size() * host_page_bytes(), std::move(done), nullptr);
  return ok_status();
}

Status SimTransferPort::write_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                                    TransferDone done) {
  if (host_frames.size() != geometry_.layers) {
    return invalid_argument("write_block of " + to_string(key) + " with " +
                            std::to_string(host_frames.size()) + " pages, geometry has " +
                            std::to_string(geometry_.layers) + " layers");
  }
  if (on_nvme_.contains(key) && !writing_.contains(key)) {
    return already_exists("block " + to_string(key) + " is already on nvme");
  }
  if (!on_nvme_.contains(key) && !writing_.contains(key) &&
      on_nvme_.size() + writing_.size() + retired_extents_ >= spec_.nvme_extents) {
    return resource_exhausted("nvme store full: " + std::to_string(spec_.nvme_extents) +
                              " extents, " + std::to_string(retired_extents_) + " of them retired");
  }
  const bool bad_extent = bad_extent_writes_ > 0;
  if (bad_extent) --bad_extent_writes_;
  writing_.insert(key);
  schedule(
      Link::kHostToNvme, nvme_page_bytes() * geometry_.layers,
      [this, key, bad_extent, done = std::move(done)](const Status& s) {
        writing_.erase(key);
        if (bad_extent) retire_an_extent();  // before the caller hears, as the real store does
        done(s);
      },
      [this, key] { on_nvme_.insert(key); }, bad_extent);
  return ok_status();
}

Status SimTransferPort::read_block(const BlockKey& key, std::span<const uint32_t> host_frames,
                                   TransferDone done, FramesReleased released) {
  if (!on_nvme_.contains(key)) return not_found("block " + to_string(key) + " is not on nvme");
  if (host_frames.size() != geometry_.layers) {
    return invalid_argument("read_block with " + std::to_string(host_frames.size()) +
                            " pages, geometry has " + std::to_string(geometry_.layers) + " layers");
  }
  schedule_read(key, nvme_page_bytes() * geometry_.layers, std::move(done), std::move(released));
  return ok_status();
}

Status SimTransferPort::read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame,
                                  TransferDone done, FramesReleased released) {
  if (!on_nvme_.contains(key)) return not_found("block " + to_string(key) + " is not on nvme");
  if (layer >= geometry_.layers) {
    return out_of_range("layer " + std::to_string(layer) + " of " + to_string(key));
  }
  schedule_read(key, nvme_page_bytes(), std::move(done), std::move(released));
  return ok_status();
}

void SimTransferPort::schedule_read(const BlockKey& key, uint64_t bytes, TransferDone done,
                                    FramesReleased released) {
  if (hang_reads_ > 0) {
    --hang_reads_;
    auto abandoned = [this, key, done = std::move(done),
                      released = std::move(released)](const Status& modeled) mutable {
      modeled.ignore();  // the modeled failure stands for the timeout
      hung_releases_.push_back(std::move(released));
      done(deadline_exceeded("read of block " + to_string(key) +
                             " unanswered past the I/O timeout; abandoned, its frames stay the "
                             "drive's until it answers"));
    };
    schedule(Link::kNvmeToHost, bytes, std::move(abandoned), nullptr, /*fail=*/true);
    return;
  }
  const bool bad_extent = bad_extent_reads_ > 0;
  if (bad_extent) {
    --bad_extent_reads_;
    on_bad_extents_.insert(key);
  }
  auto then_release = [done = std::move(done), released = std::move(released)](const Status& s) {
    const bool failed = !s.ok();
    done(s);
    if (failed && released) released();
  };
  schedule(Link::kNvmeToHost, bytes, std::move(then_release), nullptr, bad_extent);
}

void SimTransferPort::answer_hung_reads() {
  std::vector<FramesReleased> answered;
  answered.swap(hung_releases_);
  for (FramesReleased& released : answered) {
    if (released) loop_.post(std::move(released));
  }
}

void SimTransferPort::retire_an_extent() {
  if (retired_extents_ < max_retired_extents(static_cast<uint32_t>(spec_.nvme_extents))) {
    ++retired_extents_;
  }
}

Status SimTransferPort::erase_block(const BlockKey& key) {
  if (on_nvme_.erase(key) == 0) return not_found("block " + to_string(key) + " is not on nvme");
  if (on_bad_extents_.erase(key) != 0) retire_an_extent();
  return ok_status();
}

}  // namespace kvtier
