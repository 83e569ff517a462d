#include "tiers/extent_allocator.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace kvtier {

Result<std::unique_ptr<ExtentAllocator>> ExtentAllocator::create(
    std::vector<uint32_t> extents_per_file, uint64_t extent_bytes, uint64_t first_offset) {
  if (extent_bytes == 0) return invalid_argument("extent size must be > 0 bytes");
  uint64_t total = 0;
  for (uint32_t n : extents_per_file) total += n;
  if (total > FrameAllocator::kMaxFrames) {
    return invalid_argument("NVMe store of " + std::to_string(total) + " extents exceeds the " +
                            std::to_string(FrameAllocator::kMaxFrames) + "-extent limit");
  }
  KVTIER_ASSIGN_OR_RETURN(auto frames, FrameAllocator::create(static_cast<uint32_t>(total)));
  return std::unique_ptr<ExtentAllocator>(new ExtentAllocator(
      std::move(extents_per_file), extent_bytes, first_offset, std::move(frames)));
}

ExtentAllocator::ExtentAllocator(std::vector<uint32_t> extents_per_file, uint64_t extent_bytes,
                                 uint64_t first_offset, std::unique_ptr<FrameAllocator> frames)
    : extents_per_file_(std::move(extents_per_file)),
      extent_bytes_(extent_bytes),
      first_offset_(first_offset),
      frames_(std::move(frames)) {
  uint32_t start = 0;
  for (uint32_t n : extents_per_file_) {
    file_start_.push_back(start);
    start += n;
  }
}

uint32_t ExtentAllocator::retire_free_in_file(uint32_t file) {
  std::vector<uint32_t> others;
  uint32_t retired = 0;
  for (Result<uint32_t> e = frames_->allocate(); e.ok(); e = frames_->allocate()) {
    const Result<ExtentLocation> at = locate(*e);
    if (at.ok() && at->file == file && frames_->retire(*e).ok()) {
      ++retired;
    } else {
      others.push_back(*e);
    }
  }
  // Given back in reverse, so the free stacks hand them out in about the order they did.
  for (auto it = others.rbegin(); it != others.rend(); ++it) frames_->free(*it).ignore();
  return retired;
}

uint32_t ExtentAllocator::unretire_in_file(uint32_t file,
                                           const std::vector<uint8_t>& keep_retired) {
  uint32_t back = 0;
  const uint32_t first = first_extent_of(file);
  for (uint32_t e = first; e < first + extents_per_file_[file]; ++e) {
    const bool keep = e < keep_retired.size() && keep_retired[e] != 0;
    if (!keep && frames_->is_retired(e) && frames_->unretire(e).ok()) ++back;
  }
  return back;
}

Result<ExtentLocation> ExtentAllocator::locate(uint32_t extent) const {
  if (extent >= capacity()) {
    return out_of_range("extent " + std::to_string(extent) + " is past the store's " +
                        std::to_string(capacity()) + " extents");
  }
  // The last file whose first index is <= extent.
  auto it = std::upper_bound(file_start_.begin(), file_start_.end(), extent);
  const auto file = static_cast<uint32_t>(std::distance(file_start_.begin(), it) - 1);
  return ExtentLocation{file, first_offset_ + (extent - file_start_[file]) * extent_bytes_};
}

Result<uint32_t> ExtentAllocator::extent_at(uint32_t file, uint64_t offset) const {
  if (file >= file_count()) {
    return not_found("no file " + std::to_string(file) + " in a store of " +
                     std::to_string(file_count()) + " files");
  }
  if (offset < first_offset_ || (offset - first_offset_) % extent_bytes_ != 0) {
    return not_found("no extent starts at offset " + std::to_string(offset) + " of file " +
                     std::to_string(file));
  }
  const uint64_t slot = (offset - first_offset_) / extent_bytes_;
  if (slot >= extents_per_file_[file]) {
    return not_found("offset " + std::to_string(offset) + " is past the extents of file " +
                     std::to_string(file));
  }
  return file_start_[file] + static_cast<uint32_t>(slot);
}

}  // namespace kvtier
