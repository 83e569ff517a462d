// CUDA launchers of the fp8 page codec (batch contract in kernels/page_codec.hpp, kernels in
// page_codec.cu). Includable from plain C++; declared only in CUDA builds.
//
// Encode: wide pages -> PageFormat's fp8 pages [K e4m3][V e4m3][k_scale][v_scale], byte for byte
// what kernels::cpu::quantize_page_fp8 writes (a half holding NaN or inf gets zero bytes and a
// NaN scale, as on the CPU; the caller refuses that page). Decode: the reverse, byte for byte
// kernels::cpu::dequantize_page_fp8 (a NaN scale decodes to NaN). Pages are device memory or mapped
// pinned host memory, in any mix; the HBM <-> host copies of an fp8 host tier point one side at
// each.
//
// The launchers validate the batch on the host (validate_page_codec_batch with their direction)
// and return cudaErrorInvalidValue, logging why, before any CUDA call when it is bad or the stream
// is the legacy default one (nullptr). Otherwise they enqueue on `stream` and return the launch's
// error; they never synchronize. The batch is copied into the launch: it may be reused at once,
// the pages it points at may not until the stream has run the work. Thread-safe.
#pragma once

#if defined(KVTIER_HAVE_CUDA)

#include <cuda_runtime_api.h>

#include "kernels/page_codec.hpp"

namespace kvtier::kernels::cuda {

cudaError_t launch_encode_pages_fp8(const PageCodecBatch& b, cudaStream_t stream);
cudaError_t launch_decode_pages_fp8(const PageCodecBatch& b, cudaStream_t stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_HAVE_CUDA
