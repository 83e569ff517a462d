#include "kernels/frame_ops.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace kvtier::kernels {
namespace {

Status check_ids(const char* what, const uint32_t* frames, uint32_t count, uint32_t num_frames,
                 bool check_distinct) {
  if (count == 0) return ok_status();
  if (frames == nullptr) return invalid_argument(std::string(what) + ": frame list is null");
  for (uint32_t i = 0; i < count; ++i) {
    if (frames[i] >= num_frames) {
      return out_of_range(std::string(what) + ": entry " + std::to_string(i) + " names frame " +
                          std::to_string(frames[i]) + " of an arena of " +
                          std::to_string(num_frames) + " frames");
    }
  }
  if (check_distinct && count > 1) {
    std::vector<uint32_t> sorted(frames, frames + count);
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      return invalid_argument(std::string(what) + ": frame " + std::to_string(*dup) +
                              " is listed twice; a scatter's frames must be distinct");
    }
  }
  return ok_status();
}

}  // namespace

Status validate_frame_copy_shape(const FrameCopyParams& p) {
  if (p.count == 0) return ok_status();
  if (p.arena == nullptr || p.staging == nullptr) {
    return invalid_argument("frame copy: arena or staging is null");
  }
  if (p.frame_bytes == 0 || p.frame_bytes > p.frame_stride) {
    return invalid_argument("frame copy: frame_bytes " + std::to_string(p.frame_bytes) +
                            " is zero or above frame_stride " + std::to_string(p.frame_stride));
  }
  return ok_status();
}

Status validate_frame_copy(const FrameCopyParams& p, bool check_distinct) {
  KVTIER_RETURN_IF_ERROR(validate_frame_copy_shape(p));
  return check_ids("frame copy", p.frames, p.count, p.num_frames, check_distinct);
}

Status validate_fp8_frames_shape(const Fp8FramesParams& p) {
  if (p.dtype == Dtype::kFP8E4M3 || dtype_size(p.dtype) == 0) {
    return invalid_argument(
        std::string("fp8 frames: the frames' dtype must be f32, f16 or bf16, not ") +
        std::string(dtype_name(p.dtype)));
  }
  if (p.page_tokens == 0 || p.kv_heads == 0 || p.head_dim == 0) {
    return invalid_argument("fp8 frames: page_tokens, kv_heads and head_dim must be positive");
  }
  if (p.frame_stride < p.wide_page_bytes()) {
    return invalid_argument("fp8 frames: frame_stride " + std::to_string(p.frame_stride) +
                            " is below the page size " + std::to_string(p.wide_page_bytes()));
  }
  if (p.count == 0) return ok_status();
  if (p.arena == nullptr || p.staging == nullptr || p.scales == nullptr) {
    return invalid_argument("fp8 frames: arena, staging or scales is null");
  }
  return ok_status();
}

Status validate_fp8_frames(const Fp8FramesParams& p, bool check_distinct) {
  KVTIER_RETURN_IF_ERROR(validate_fp8_frames_shape(p));
  return check_ids("fp8 frames", p.frames, p.count, p.num_frames, check_distinct);
}

}  // namespace kvtier::kernels
