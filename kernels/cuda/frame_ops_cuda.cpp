#include "kernels/cuda/frame_ops_cuda.hpp"

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
