// Parameters of the copies between paged frames and packed staging buffers, shared by the CPU
// functions (kernels/cpu/frame_ops.hpp) and the CUDA launchers (kernels/cuda/frame_ops_cuda.hpp).
//
// The transfer engine turns many small pages into few large copies: gather packs a list of frames
// into one contiguous staging buffer (slot i = frames[i]) for one DMA or one NVMe write; scatter is
// the inverse. The fp8 forms do the same while converting a wide page (f32/f16/bf16) to fp8 e4m3
// with one scale per half page (K, V): scale = amax / 448 (1 for an all-zero half), stored value
// = e4m3(x * (448 / amax)) rounded to nearest even, value read back = e4m3 * scale. Offloading in
// fp8 halves (bf16) the bytes moved; the round trip is lossy, within e4m3's 2^-4 relative step.
//
// All pointers are borrowed for one call (CPU) or until the stream has run the work (CUDA: device
// or mapped pinned host pointers). In a scatter, frame ids must be distinct (CPU checks; two
// slots writing one frame would race).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::kernels {

struct FrameCopyParams {
  uint8_t* arena = nullptr;   // [num_frames][frame_stride]
  uint64_t frame_stride = 0;  // bytes
  uint32_t num_frames = 0;
  uint64_t frame_bytes = 0;          // bytes copied per frame (a page), <= frame_stride
  const uint32_t* frames = nullptr;  // [count] frame ids
  uint32_t count = 0;
  uint8_t* staging = nullptr;  // [count][frame_bytes]
};

struct Fp8FramesParams {
  uint8_t* arena = nullptr;  // [num_frames][frame_stride], pages of `dtype`
  uint64_t frame_stride = 0;
  uint32_t num_frames = 0;
  Dtype dtype = Dtype::kBF16;  // the wide format of the frames: f32, f16 or bf16
  uint32_t page_tokens = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  const uint32_t* frames = nullptr;  // [count]
  uint32_t count = 0;
  uint8_t* staging = nullptr;  // [count][fp8_page_bytes()] fp8 pages, K then V
  float* scales = nullptr;     // [count][2] = (k_scale, v_scale)

  // Elements in K (or V) of one page.
  std::size_t half_elems() const {
    return static_cast<std::size_t>(page_tokens) * kv_heads * head_dim;
  }
  std::size_t fp8_page_bytes() const { return 2 * half_elems(); }
  std::size_t wide_page_bytes() const { return 2 * half_elems() * dtype_size(dtype); }
};

// Shapes and ids (host-readable `frames`); `check_distinct` for scatters.
Status validate_frame_copy(const FrameCopyParams& p, bool check_distinct);
Status validate_fp8_frames(const Fp8FramesParams& p, bool check_distinct);
// Shapes only, for launchers whose frame list lives on the device.
Status validate_frame_copy_shape(const FrameCopyParams& p);
Status validate_fp8_frames_shape(const Fp8FramesParams& p);

}  // namespace kvtier::kernels
