// CUDA launchers of the frame <-> staging copies and their fp8 forms (contract in
// kernels/frame_ops.hpp; kernels in frame_ops.cu). Includable from plain C++; CUDA builds only.
//
// `frames` is a device array; arena and staging are device pointers or mapped pinned host
// memory (so a gather can write straight into a pinned buffer for the NVMe path). Launchers check
// shapes, enqueue on the given stream (never the legacy default one) and return; frame ids are
// not checked on the device, so validate the host copy of the list. A quantized half page holding
// NaN or inf gets a NaN scale and zero bytes (the CPU path also returns an error for it).
#pragma once

#if defined(KVTIER_HAVE_CUDA)

#include <cuda_runtime_api.h>

#include "kernels/frame_ops.hpp"

namespace kvtier::kernels::cuda {

cudaError_t launch_gather_frames(const FrameCopyParams& p, cudaStream_t stream);
cudaError_t launch_scatter_frames(const FrameCopyParams& p, cudaStream_t stream);
cudaError_t launch_quantize_frames_fp8(const Fp8FramesParams& p, cudaStream_t stream);
cudaError_t launch_dequantize_frames_fp8(const Fp8FramesParams& p, cudaStream_t stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_HAVE_CUDA
