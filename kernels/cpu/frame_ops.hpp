// CPU gather/scatter between paged frames and packed staging buffers, and the fp8 forms that
// quantize on the way out and dequantize on the way in (contract in kernels/frame_ops.hpp).
//
// Plain copies are memcpy per frame, spread over oneTBB workers once a call moves more than a few
// MiB (one core does not saturate memory bandwidth). The fp8 forms read each half page twice,
// the second time from cache: once for its amax, once to convert (IsaKernels::convert, widened
// and narrowed in registers).
// Calls are independent and thread-safe; on error nothing is guaranteed about staging/frames
// already written by that call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.hpp"
#include "kernels/frame_ops.hpp"
#include "kvtier/status.hpp"

namespace kvtier::kernels::cpu {

Status gather_frames(const FrameCopyParams& p);
Status scatter_frames(const FrameCopyParams& p);

// A frame whose half page holds NaN or inf gets a NaN scale and zeros, and the call returns
// invalid_argument naming the first such frame (after processing all of them).
Status quantize_frames_fp8(const Fp8FramesParams& p, Isa isa = Isa::kAuto);
Status dequantize_frames_fp8(const Fp8FramesParams& p, Isa isa = Isa::kAuto);

// One page: `half_elems` elements of K then as many of V. Returns false (NaN scale, zeros) when
// a half holds NaN or inf.
bool quantize_page_fp8(const IsaKernels& isa, const void* src, Dtype dtype, std::size_t half_elems,
                       uint8_t* dst, float* k_scale, float* v_scale);
void dequantize_page_fp8(const IsaKernels& isa, const uint8_t* src, float k_scale, float v_scale,
                         Dtype dtype, std::size_t half_elems, void* dst);

}  // namespace kvtier::kernels::cpu
