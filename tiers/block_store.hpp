// BlockStore: a key-addressed, asynchronous tier of whole blocks — the NVMe store today, a remote
// pool (Redis/Valkey, Mooncake Store) later.
//
// Addressed by block key, never by location, so nothing above assumes the tier is a local file.
// Every data operation is asynchronous and returns a Transfer (tiers/transfer.hpp); request errors
// (wrong page count, unknown key, store full) are the submit call's Status and start nothing.
// Equal keys mean equal bytes, so writing a key the store already holds is refused with
// kAlreadyExists rather than repeated: the caller counts that as present. Writing a key the store
// is still writing is not repeated either: the new write joins the one in flight and completes
// with its outcome, so a caller is never told "present" about a write that may yet fail.
//
// Buffers: a block is `geometry().layers` pages, one buffer per layer (they need not be adjacent).
// Each buffer must be aligned to buffer_alignment() and hold page_io_bytes() (the page rounded up
// to the I/O alignment: reads may fill that padding, writes send it). Buffers stay owned by the
// caller and must stay valid, and unmodified for writes, until the transfer completes.
//
// Integrity: every page carries a checksum; a read whose data or header does not match completes
// with kDataLoss, the block is dropped from the store, and the caller's buffers hold no valid page
// (the page stays a miss). Thread-safe: any thread may call any method.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "tiers/transfer.hpp"

namespace kvtier {

class BlockStore {
 public:
  virtual ~BlockStore() = default;

  virtual const Geometry& geometry() const = 0;
  virtual std::size_t page_io_bytes() const = 0;
  virtual std::size_t buffer_alignment() const = 0;

  virtual Result<Transfer> write_block(const BlockKey& key, std::span<const std::byte* const> pages,
                                       TransferOptions options = {}) = 0;
  virtual Result<Transfer> read_block(const BlockKey& key, std::span<std::byte* const> pages,
                                      TransferOptions options = {}) = 0;
  virtual Result<Transfer> read_page(const BlockKey& key, uint32_t layer, std::byte* page,
                                     TransferOptions options = {}) = 0;

  // Forgets a block (reads in flight finish first; its space is reused after them).
  virtual Status erase(const BlockKey& key) = 0;
  // True when a read of `key` would be served (written completely, not dropped).
  virtual bool contains(const BlockKey& key) const = 0;
  // Every readable key, e.g. the blocks recovered after a restart.
  virtual std::vector<BlockKey> keys() const = 0;

  virtual uint64_t capacity_blocks() const = 0;
  virtual uint64_t used_blocks() const = 0;  // extents held: readable, being written, draining
  // Blocks of space taken out of service for good (bad sectors); capacity_blocks() excludes them.
  virtual uint64_t retired_blocks() const { return 0; }
  // Blocks the store dropped on its own since the last call (a dead drive took them; each is no
  // longer contains()'d): their holders forget them.
  virtual std::vector<BlockKey> take_lost_blocks() { return {}; }
  // Quiescent-point check of the store's accounting (used + free = capacity, index consistency).
  virtual Status audit() const = 0;
};

}  // namespace kvtier
