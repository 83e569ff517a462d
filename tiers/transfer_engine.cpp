#include "tiers/transfer_engine.hpp"

#include <algorithm>

namespace kvtier {

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(HbmArena& hbm, HostPool& host,
                                                               BlockStore* store,
                                                               TransferEngineOptions options) {
  if (!(hbm.geometry() == host.geometry())) {
    return invalid_argument("transfer engine: HBM and host tiers have different geometries");
  }
  if (store != nullptr) {
    // The store receives host frames as they are: it must hold pages in the host's format.
    if (!(store->geometry() == host.page_format().stored_geometry())) {
      return invalid_argument(
          "transfer engine: the NVMe store holds pages of another geometry or dtype than the "
          "host tier (" +
          std::string(dtype_name(store->geometry().dtype)) + " vs " +
          std::string(dtype_name(host.page_format().stored_dtype)) + ")");
    }
    if (store->page_io_bytes() > host.frame_bytes() ||
        FrameArena::kFrameAlignment % store->buffer_alignment() != 0) {
      return invalid_argument(
          "transfer engine: NVMe I/O of " + std::to_string(store->page_io_bytes()) +
          " bytes aligned to " + std::to_string(store->buffer_alignment()) +
          " does not fit host frames of " + std::to_string(host.frame_bytes()) + " bytes");
    }
  }
  auto stats = options.stats ? options.stats : std::make_shared<TransferStats>();
  std::shared_ptr<CompletionNotifier> notifier = options.notifier;
  if (!notifier) {
    KVTIER_ASSIGN_OR_RETURN(notifier, CompletionNotifier::create());
  }
  std::unique_ptr<CopyEngine> copy = std::move(options.copy_engine);
  if (!copy) {
    if (hbm.device_memory()) {
      KVTIER_ASSIGN_OR_RETURN(copy, make_cuda_copy_engine(hbm.device(), stats));
    } else {
      KVTIER_ASSIGN_OR_RETURN(copy,
                              make_host_copy_engine(HostCopyOptions{options.link_gbps}, stats));
    }
  }
  return std::unique_ptr<TransferEngine>(
      new TransferEngine(hbm, host, store, std::move(stats), std::move(notifier), std::move(copy)));
}

TransferEngine::TransferEngine(HbmArena& hbm, HostPool& host, BlockStore* store,
                               std::shared_ptr<TransferStats> stats,
                               std::shared_ptr<CompletionNotifier> notifier,
                               std::unique_ptr<CopyEngine> copy)
    : hbm_(hbm),
      host_(host),
      store_(store),
      stats_(std::move(stats)),
      notifier_(std::move(notifier)),
      copy_(std::move(copy)) {
  for (int d = 0; d < 2; ++d) {
    hbm_last_[d].assign(hbm.frame_count(), 0);
    host_last_[d].assign(host.frame_count(), 0);
  }
}

TransferEngine::~TransferEngine() {
  copy_.reset();  // its destructor drains both queues
}

Result<Transfer> TransferEngine::copy(CopyDirection direction, std::span<const FramePair> pages,
                                      TransferOptions options) {
  const bool to_host = direction == CopyDirection::kHbmToHost;
  const char* what = to_host ? "copy hbm->host" : "copy host->hbm";
  if (pages.empty()) return invalid_argument(std::string(what) + ": no pages");
  const FrameArena& src = to_host ? static_cast<const FrameArena&>(hbm_) : host_;
  const FrameArena& dst = to_host ? static_cast<const FrameArena&>(host_) : hbm_;
  for (const FramePair& p : pages) {
    if (p.src >= src.frame_count() || p.dst >= dst.frame_count()) {
      return invalid_argument(std::string(what) + ": frame pair (" + std::to_string(p.src) +
                              " -> " + std::to_string(p.dst) + ") is past the arenas (" +
                              std::to_string(src.frame_count()) + " " +
                              std::string(tier_name(src.tier())) + " frames, " +
                              std::to_string(dst.frame_count()) + " " +
                              std::string(tier_name(dst.tier())) + " frames)");
    }
  }
  const std::size_t page = hbm_.page_bytes();
  const std::size_t stride = hbm_.frame_bytes();

  CopyJob job;
  job.direction = direction;
  job.pages = static_cast<uint32_t>(pages.size());
  job.wait_device_event = options.wait_device_event;
  if (host_.page_format().encodes()) {
    // The host holds pages re-encoded: one segment per page, the codec runs on each.
    job.host_format = host_.page_format();
    for (const FramePair& p : pages) {
      job.segments.push_back(CopySegment{dst.frame_address(p.dst), src.frame_address(p.src), page});
      job.hbm_frames.push_back(to_host ? p.src : p.dst);
    }
  } else {
    // Coalesce runs that are consecutive on both sides into one segment (frames are the same size
    // in both arenas). The padding between pages inside a run is copied too: it belongs to the
    // frames and costs less than a second copy.
    std::size_t i = 0;
    while (i < pages.size()) {
      std::size_t n = 1;
      while (i + n < pages.size() && pages[i + n].src == pages[i].src + n &&
             pages[i + n].dst == pages[i].dst + n) {
        ++n;
      }
      job.segments.push_back(CopySegment{dst.frame_address(pages[i].dst),
                                         src.frame_address(pages[i].src), (n - 1) * stride + page});
      i += n;
    }
  }
  // The link carries pages as the host holds them (fp8 and scales when it re-encodes).
  job.state = std::make_shared<TransferState>(copy_link(direction),
                                              uint64_t{host_.page_bytes()} * pages.size(),
                                              std::move(options), stats_, notifier_);
  Transfer handle(job.state);

  const int d = static_cast<int>(direction);
  const int o = 1 - d;
  std::lock_guard<std::mutex> lock(hazard_mu_);
  job.seq = ++next_seq_[d];
  uint64_t after = 0;
  for (const FramePair& p : pages) {
    const uint32_t hbm_frame = to_host ? p.src : p.dst;
    const uint32_t host_frame = to_host ? p.dst : p.src;
    after = std::max({after, hbm_last_[o][hbm_frame], host_last_[o][host_frame]});
    hbm_last_[d][hbm_frame] = job.seq;
    host_last_[d][host_frame] = job.seq;
  }
  job.after_other_seq = after > copy_->completed(other_direction(direction)) ? after : 0;
  Status s = copy_->submit(std::move(job));
  if (!s.ok()) {
    // Only at shutdown. The frames' hazard marks now name a job that never runs; later jobs
    // then wait for nothing more than the seq's next owner, which is conservative.
    --next_seq_[d];
    handle.detach();
    return s;
  }
  return handle;
}

Result<std::vector<std::byte*>> TransferEngine::host_addresses(
    std::span<const uint32_t> frames) const {
  std::vector<std::byte*> out;
  out.reserve(frames.size());
  for (uint32_t f : frames) {
    KVTIER_ASSIGN_OR_RETURN(std::byte * p, host_.checked_frame_address(f));
    out.push_back(p);
  }
  return out;
}

Result<Transfer> TransferEngine::write_block(const BlockKey& key,
                                             std::span<const uint32_t> host_frames,
                                             TransferOptions options) {
  if (store_ == nullptr) return unavailable("write_block: no NVMe tier is configured");
  KVTIER_ASSIGN_OR_RETURN(auto addrs, host_addresses(host_frames));
  std::vector<const std::byte*> pages(addrs.begin(), addrs.end());
  return store_->write_block(key, pages, std::move(options));
}

Result<Transfer> TransferEngine::read_block(const BlockKey& key,
                                            std::span<const uint32_t> host_frames,
                                            TransferOptions options) {
  if (store_ == nullptr) return unavailable("read_block: no NVMe tier is configured");
  KVTIER_ASSIGN_OR_RETURN(auto addrs, host_addresses(host_frames));
  return store_->read_block(key, addrs, std::move(options));
}

Result<Transfer> TransferEngine::read_page(const BlockKey& key, uint32_t layer, uint32_t host_frame,
                                           TransferOptions options) {
  if (store_ == nullptr) return unavailable("read_page: no NVMe tier is configured");
  KVTIER_ASSIGN_OR_RETURN(std::byte * p, host_.checked_frame_address(host_frame));
  return store_->read_page(key, layer, p, std::move(options));
}

}  // namespace kvtier
