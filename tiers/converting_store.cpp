#include "tiers/converting_store.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "tiers/key_text.hpp"
#include "tiers/page_codec.hpp"

namespace kvtier {

// Aligned buffers of one size, reused. Deleters of handed-out buffers keep the pool alive.
class ConvertingStore::StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  StagingPool(std::size_t align, std::size_t bytes, std::size_t max_idle)
      : align_(align), bytes_(bytes), max_idle_(max_idle) {}

  Result<std::shared_ptr<std::byte>> take() {
    AlignedBytes buf;
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        buf = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (!buf) buf = aligned_bytes(align_, bytes_);
    if (!buf) {
      return resource_exhausted("no memory for a " + std::to_string(bytes_) +
                                "-byte fp8 staging buffer");
    }
    return std::shared_ptr<std::byte>(
        buf.release(), [self = shared_from_this()](std::byte* p) { self->give_back(p); });
  }

 private:
  void give_back(std::byte* p) noexcept {
    AlignedBytes buf(p);
    std::lock_guard lock(mu_);
    if (idle_.size() < max_idle_) idle_.push_back(std::move(buf));
  }

  const std::size_t align_;
  const std::size_t bytes_;
  const std::size_t max_idle_;
  std::mutex mu_;
  std::vector<AlignedBytes> idle_;  // guarded by mu_
};

namespace {

// The callback of a read into staging: on OK, dequantizes staged page i (`stride` bytes apart) into
// pages[i]; then runs `then`, and `released`: the drive only ever fills the staging, so the
// caller's pages are free once the read completed, even one abandoned while the drive holds it.
// Captures values only, so it may run after the store is gone (a queued read cancelled while the
// stack shuts down).
TransferCallback decode_then(const PageFormat& format, std::size_t stride,
                             std::vector<std::byte*> pages, std::shared_ptr<std::byte> staging,
                             TransferCallback then, TransferCallback released) {
  return [format, stride, pages = std::move(pages), staging = std::move(staging),
          then = std::move(then), released = std::move(released)](const Status& s) {
    if (s.ok()) {
      for (std::size_t i = 0; i < pages.size(); ++i) {
        decode_page(format, staging.get() + i * stride, pages[i]);
      }
    }
    if (then) then(s);
    if (released) released(s);
  };
}

// The options of the inner read: the caller's, the callback decoding into its pages. The inner
// store may abandon the read at its I/O timeout (on_buffers_released is set); the staging then
// stays with the inner transfer, whose store keeps it until the drive answers.
TransferOptions staged_read_options(TransferOptions options, const PageFormat& format,
                                    std::size_t stride, std::vector<std::byte*> pages,
                                    std::shared_ptr<std::byte> staging) {
  options.on_complete =
      decode_then(format, stride, std::move(pages), std::move(staging),
                  std::move(options.on_complete), std::move(options.on_buffers_released));
  options.on_buffers_released = [](const Status&) {};
  return options;
}

}  // namespace

Result<std::unique_ptr<ConvertingStore>> ConvertingStore::create(BlockStore& inner,
                                                                 const PageFormat& format,
                                                                 std::size_t max_idle_staging) {
  const Dtype wide = format.geometry.dtype;
  if (!format.encodes() || format.stored_dtype != Dtype::kFP8E4M3 || wide == Dtype::kFP8E4M3) {
    return invalid_argument("converting store: pages of " + std::string(dtype_name(wide)) +
                            " cannot be stored as " + std::string(dtype_name(format.stored_dtype)) +
                            " (only f32, f16 and bf16 pages are quantized to fp8_e4m3)");
  }
  if (!(inner.geometry() == format.stored_geometry()) ||
      inner.page_io_bytes() < format.page_bytes()) {
    return invalid_argument("converting store: the inner store holds pages of another format");
  }
  const std::size_t align = inner.buffer_alignment();
  const std::size_t stride = inner.page_io_bytes();
  auto blocks =
      std::make_shared<StagingPool>(align, stride * format.geometry.layers, max_idle_staging);
  auto pages = std::make_shared<StagingPool>(align, stride, max_idle_staging);
  return std::unique_ptr<ConvertingStore>(
      new ConvertingStore(inner, format, std::move(blocks), std::move(pages)));
}

ConvertingStore::ConvertingStore(BlockStore& inner, const PageFormat& format,
                                 std::shared_ptr<StagingPool> blocks,
                                 std::shared_ptr<StagingPool> pages)
    : inner_(inner),
      format_(format),
      stride_(inner.page_io_bytes()),
      block_staging_(std::move(blocks)),
      page_staging_(std::move(pages)) {}

Result<Transfer> ConvertingStore::write_block(const BlockKey& key,
                                              std::span<const std::byte* const> pages,
                                              TransferOptions options) {
  const uint32_t layers = format_.geometry.layers;
  if (pages.size() != layers) {
    return invalid_argument("write_block " + key_text(key) + ": " + std::to_string(pages.size()) +
                            " pages given, the geometry has " + std::to_string(layers) + " layers");
  }
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<std::byte> staging, block_staging_->take());
  std::vector<const std::byte*> staged(layers);
  for (uint32_t i = 0; i < layers; ++i) {
    if (pages[i] == nullptr) {
      return invalid_argument("write_block " + key_text(key) + ": page of layer " +
                              std::to_string(i) + " is null");
    }
    staged[i] = staged_page(staging.get(), i);
    if (!encode_page(format_, pages[i], staged_page(staging.get(), i))) {
      return invalid_argument("write_block " + key_text(key) + ": layer " + std::to_string(i) +
                              " holds NaN or inf, which fp8_e4m3 cannot store; block not written");
    }
  }
  // The inner write reads staging until it completes; its callback owns it until then.
  TransferCallback then = std::move(options.on_complete);
  options.on_complete = [staging, then = std::move(then)](const Status& s) {
    if (then) then(s);
  };
  return inner_.write_block(key, staged, std::move(options));
}

Result<Transfer> ConvertingStore::read_block(const BlockKey& key, std::span<std::byte* const> pages,
                                             TransferOptions options) {
  const uint32_t layers = format_.geometry.layers;
  if (pages.size() != layers) {
    return invalid_argument("read_block " + key_text(key) + ": " + std::to_string(pages.size()) +
                            " pages given, the geometry has " + std::to_string(layers) + " layers");
  }
  for (uint32_t i = 0; i < layers; ++i) {
    if (pages[i] == nullptr) {
      return invalid_argument("read_block " + key_text(key) + ": page of layer " +
                              std::to_string(i) + " is null");
    }
  }
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<std::byte> staging, block_staging_->take());
  std::vector<std::byte*> staged(layers);
  for (uint32_t i = 0; i < layers; ++i) staged[i] = staged_page(staging.get(), i);
  return inner_.read_block(key, staged,
                           staged_read_options(std::move(options), format_, stride_,
                                               {pages.begin(), pages.end()}, std::move(staging)));
}

Result<Transfer> ConvertingStore::read_page(const BlockKey& key, uint32_t layer, std::byte* page,
                                            TransferOptions options) {
  if (page == nullptr) {
    return invalid_argument("read_page " + key_text(key) + ": the page buffer is null");
  }
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<std::byte> staging, page_staging_->take());
  std::byte* staged = staging.get();
  return inner_.read_page(
      key, layer, staged,
      staged_read_options(std::move(options), format_, stride_, {page}, std::move(staging)));
}

}  // namespace kvtier
