// ConvertingStore: a BlockStore that keeps its callers' pages in a narrower PageFormat — fp8 e4m3
// with a K and a V scale per page under bf16/f16/f32 host pages (tiers.nvme.kv_dtype: fp8_e4m3).
//
// It wraps the store that holds the encoded pages (the NvmeStore, opened with that format) and
// converts at its edge, so nothing else changes: the transfer engine hands it host frames in the
// model's dtype, and the NVMe store checksums, writes and reads encoded pages like any others.
//   - Writes quantize every page into a staging buffer on the calling thread (the scheduler's loop:
//     bf16 quantizes at about 19 GB/s on the development VM, attention_bench BM_QuantizeFp8, so
//     ~0.1 ms per 2 MiB block, a third of its fp8 write at 3.4 GB/s), then submit it. A page
//     holding NaN or inf is refused with the block's key and layer, and nothing is written: fp8 has
//     no way to keep it.
//   - Reads land in staging; the inner transfer's callback dequantizes into the caller's pages on
//     the I/O thread that completed it, then runs the caller's callback. TransferState runs the
//     callback before it wakes waiters and signals the eventfd, so when a read is seen complete
//     and OK the caller's pages hold the block in their own dtype. Failed or cancelled reads leave
//     the caller's pages untouched. The drive only ever fills staging, so a caller's
//     on_buffers_released runs right after its callback, and a read the drive holds past the I/O
//     timeout is always abandoned then (transfer.hpp): its staging stays with the inner transfer
//     until the drive answers.
// The Transfer returned is the inner store's, so cancel and wait behave exactly as the store's.
// Staging buffers (a block of encoded pages, aligned for O_DIRECT) come from a free list and go
// back when the transfer's state is released; the list keeps at most `max_idle_staging` of them.
// Rejected: converting inside NvmeStore (it would mix a codec into the I/O engine, and every
// other BlockStore would need its own) and converting on the I/O thread before writes (a write's
// request errors — store full, key present — must come back from the submit call, which needs the
// extent reserved before the bytes exist).
// Thread-safe as the inner store is.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "kvtier/types.hpp"
#include "tiers/aligned_bytes.hpp"
#include "tiers/block_store.hpp"

namespace kvtier {

class ConvertingStore final : public BlockStore {
 public:
  // `inner` holds pages of `format` (format.encodes() must be true) and must outlive this store.
  static Result<std::unique_ptr<ConvertingStore>> create(BlockStore& inner,
                                                         const PageFormat& format,
                                                         std::size_t max_idle_staging = 64);

  // The caller's pages: the model's geometry, page_bytes() each, any 64-byte alignment.
  const Geometry& geometry() const override { return format_.geometry; }
  std::size_t page_io_bytes() const override { return format_.geometry.page_bytes(); }
  std::size_t buffer_alignment() const override { return 64; }

  Result<Transfer> write_block(const BlockKey& key, std::span<const std::byte* const> pages,
                               TransferOptions options = {}) override;
  Result<Transfer> read_block(const BlockKey& key, std::span<std::byte* const> pages,
                              TransferOptions options = {}) override;
  Result<Transfer> read_page(const BlockKey& key, uint32_t layer, std::byte* page,
                             TransferOptions options = {}) override;

  Status erase(const BlockKey& key) override { return inner_.erase(key); }
  bool contains(const BlockKey& key) const override { return inner_.contains(key); }
  std::vector<BlockKey> keys() const override { return inner_.keys(); }
  uint64_t capacity_blocks() const override { return inner_.capacity_blocks(); }
  uint64_t used_blocks() const override { return inner_.used_blocks(); }
  uint64_t retired_blocks() const override { return inner_.retired_blocks(); }
  std::vector<BlockKey> take_lost_blocks() override { return inner_.take_lost_blocks(); }
  Status audit() const override { return inner_.audit(); }

  const PageFormat& page_format() const { return format_; }

 private:
  class StagingPool;
  ConvertingStore(BlockStore& inner, const PageFormat& format, std::shared_ptr<StagingPool> blocks,
                  std::shared_ptr<StagingPool> pages);

  std::byte* staged_page(std::byte* staging, uint32_t i) const { return staging + i * stride_; }
  BlockStore& inner_;
  const PageFormat format_;
  const std::size_t stride_;                    // inner page_io_bytes
  std::shared_ptr<StagingPool> block_staging_;  // a block of encoded pages per buffer
  std::shared_ptr<StagingPool> page_staging_;   // one encoded page per buffer (read_page)
};

}  // namespace kvtier
