// ExtentAllocator: fixed-size NVMe extents (one per block) over one or more files or devices.
//
// Every extent has the same size (a block's header plus its `layers` pages, rounded up to the I/O
// alignment), so allocation is a FrameAllocator over the global extent index; this class adds the
// mapping index <-> (file, byte offset). Files are laid out one after another in the index space:
// file 0 holds extents [0, n0), file 1 [n0, n0 + n1), and so on. Thread-safe like FrameAllocator,
// except `reserve_all`, which claims given extents while nothing else runs (rebuilding a store's
// index after a restart).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/status.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {

struct ExtentLocation {
  uint32_t file = 0;    // index into the store's paths
  uint64_t offset = 0;  // byte offset of the extent within that file
};

// The most extents of a store of `extents` that media errors may retire: one in 32, at least one.
// Past that the device fails as a whole, not at a few sectors, and retiring more would only
// shrink the cache (see nvme_store.hpp).
inline uint32_t max_retired_extents(uint32_t extents) {
  return std::max<uint32_t>(1, extents / 32);
}

class ExtentAllocator {
 public:
  // `extents_per_file[i]` extents of `extent_bytes` each in file i, starting at byte
  // `first_offset` (room for a superblock). extent_bytes must be > 0.
  static Result<std::unique_ptr<ExtentAllocator>> create(std::vector<uint32_t> extents_per_file,
                                                         uint64_t extent_bytes,
                                                         uint64_t first_offset);

  Result<uint32_t> allocate() { return frames_->allocate(); }
  Status free(uint32_t extent) { return frames_->free(extent); }
  // Takes an allocated extent out of service for good (see FrameAllocator::retire).
  Status retire(uint32_t extent) { return frames_->retire(extent); }
  // Claims exactly these extents (see FrameAllocator::reserve_all). Quiescent use only.
  Status reserve_all(std::span<const uint32_t> extents) { return frames_->reserve_all(extents); }
  // Retires every free extent of `file` (a dead drive) and returns how many: it takes every free
  // extent and gives back those of other files, O(free extents). Quiescent use only (the caller
  // serializes every allocate and free).
  uint32_t retire_free_in_file(uint32_t file);
  // Puts the retired extents of `file` back in service, free (a drive readmitted), but those
  // with `keep_retired[extent]` set (bad sectors), and returns how many. O(extents of the file).
  uint32_t unretire_in_file(uint32_t file, const std::vector<uint8_t>& keep_retired);
  // Puts up to `most` retired extents back in service, whichever (see FrameAllocator).
  uint32_t unretire_up_to(uint32_t most) { return frames_->unretire_up_to(most); }

  Result<ExtentLocation> locate(uint32_t extent) const;
  // Inverse of locate: the extent at (file, offset), or kNotFound when none starts there.
  Result<uint32_t> extent_at(uint32_t file, uint64_t offset) const;

  // Every extent of the files, retired ones included; in_service() leaves those out.
  uint32_t capacity() const { return frames_->capacity(); }
  uint32_t in_service() const { return frames_->in_service(); }
  uint32_t retired() const { return frames_->retired(); }
  uint32_t used() const { return frames_->used(); }
  uint32_t free_count() const { return frames_->free_count(); }
  bool is_allocated(uint32_t extent) const { return frames_->is_allocated(extent); }
  bool is_retired(uint32_t extent) const { return frames_->is_retired(extent); }
  uint64_t extent_bytes() const { return extent_bytes_; }
  uint64_t first_offset() const { return first_offset_; }
  uint32_t file_count() const { return static_cast<uint32_t>(extents_per_file_.size()); }
  uint32_t extents_in_file(uint32_t file) const { return extents_per_file_.at(file); }
  // The global index of the first extent of `file`; its extents follow contiguously.
  uint32_t first_extent_of(uint32_t file) const { return file_start_.at(file); }
  Status audit() const { return frames_->audit(); }

 private:
  ExtentAllocator(std::vector<uint32_t> extents_per_file, uint64_t extent_bytes,
                  uint64_t first_offset, std::unique_ptr<FrameAllocator> frames);

  std::vector<uint32_t> extents_per_file_;
  std::vector<uint32_t> file_start_;  // first global extent index of each file
  uint64_t extent_bytes_;
  uint64_t first_offset_;
  std::unique_ptr<FrameAllocator> frames_;
};

}  // namespace kvtier
