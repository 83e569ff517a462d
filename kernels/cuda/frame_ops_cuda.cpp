#include "kernels/cuda/frame_ops_cuda.hpp"

#include <cstdint>
#include <string>

#include "kernels/cuda/launch_args.hpp"
#include "kvtier/log.hpp"

namespace kvtier::kernels::cuda {
namespace {

cudaError_t reject(const char* what, const Status& st) {
  log(LogLevel::kError, std::string(what) + " launch rejected: " + st.to_string());
  return cudaErrorInvalidValue;
}

cudaError_t copy(const FrameCopyParams& p, bool to_staging, cudaStream_t stream) {
  const char* what = to_staging ? "gather" : "scatter";
  if (stream == nullptr) return reject(what, invalid_argument("null (legacy default) stream"));
  if (Status st = validate_frame_copy_shape(p); !st.ok()) return reject(what, st);
  if (p.count > 0 && p.frames == nullptr) return reject(what, invalid_argument("frames is null"));
  const detail::CopyArgs a{p.arena, p.frame_stride, p.frame_bytes, p.frames, p.count, p.staging};
  return detail::enqueue_frame_copy(a, to_staging, stream);
}

cudaError_t fp8(const Fp8FramesParams& p, bool quantize, cudaStream_t stream) {
  const char* what = quantize ? "fp8 quantize" : "fp8 dequantize";
  if (stream == nullptr) return reject(what, invalid_argument("null (legacy default) stream"));
  if (Status st = validate_fp8_frames_shape(p); !st.ok()) return reject(what, st);
  if (p.count > 0 && p.frames == nullptr) return reject(what, invalid_argument("frames is null"));
  // The kernels load and store elements and scales as typed values: a misaligned address would
  // fault on the device (a sticky error for the whole context) instead of being refused here.
  const std::size_t es = dtype_size(p.dtype);
  if (p.count > 0 && (reinterpret_cast<uintptr_t>(p.arena) % es != 0 || p.frame_stride % es != 0 ||
                      reinterpret_cast<uintptr_t>(p.scales) % alignof(float) != 0)) {
    return reject(
        what, invalid_argument("arena and frame_stride must be multiples of the " +
                               std::to_string(es) + "-byte element, and scales 4-byte aligned"));
  }
  const detail::Fp8Args a{p.arena,        p.frame_stride, static_cast<detail::KvType>(p.dtype),
                          p.half_elems(), p.frames,       p.count,
                          p.staging,      p.scales};
  return quantize ? detail::enqueue_quantize_fp8(a, stream)
                  : detail::enqueue_dequantize_fp8(a, stream);
}

}  // namespace

cudaError_t launch_gather_frames(const FrameCopyParams& p, cudaStream_t stream) {
  return copy(p, true, stream);
}
cudaError_t launch_scatter_frames(const FrameCopyParams& p, cudaStream_t stream) {
  return copy(p, false, stream);
}
cudaError_t launch_quantize_frames_fp8(const Fp8FramesParams& p, cudaStream_t stream) {
  return fp8(p, true, stream);
}
cudaError_t launch_dequantize_frames_fp8(const Fp8FramesParams& p, cudaStream_t stream) {
  return fp8(p, false, stream);
}

}  // namespace kvtier::kernels::cuda
