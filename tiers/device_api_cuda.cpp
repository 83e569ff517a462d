// The CUDA runtime behind DeviceApi. Compiled only when the build has CUDA (KVTIER_HAVE_CUDA);
// device_api_nocuda.cpp stands in otherwise. Plain C++ against cuda_runtime_api.h: the only
// kernels it enqueues are the fp8 page codec's, through their launchers in kvtier_kernels.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "kernels/cuda/page_codec_cuda.hpp"
#include "kvtier/log.hpp"
#include "tiers/device_api.hpp"

namespace kvtier {
namespace {

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
}

bool is_no_gpu(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
}

Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status();
  StatusCode code = StatusCode::kIoError;
  if (err == cudaErrorMemoryAllocation) code = StatusCode::kResourceExhausted;
  if (is_no_gpu(err)) code = StatusCode::kUnavailable;
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidDevice) {
    code = StatusCode::kInvalidArgument;
  }
  return Status(code, what + ": " + cuda_error_text(err));
}

// Teardown calls: failures are logged, never thrown; at process exit the runtime may already be
// unloading, which is expected.
void log_release_error(cudaError_t err, const char* what) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  log(LogLevel::kWarn, std::string(what) + " failed: " + cuda_error_text(err));
}

class CudaDeviceApi final : public DeviceApi {
 public:
  explicit CudaDeviceApi(int device) : device_(device) {}

  std::string_view name() const override { return "cuda"; }
  int device() const override { return device_; }

  Result<void*> allocate_device(std::size_t bytes) override {
    KVTIER_RETURN_IF_ERROR(use_device());
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      return cuda_status(err, where("cudaMalloc(" + std::to_string(bytes) + " bytes)"));
    }
    return ptr;
  }
  void free_device(void* ptr) noexcept override {
    if (use_device().ok()) log_release_error(cudaFree(ptr), "cudaFree");
  }

  Result<void*> allocate_pinned(std::size_t bytes) override {
    KVTIER_RETURN_IF_ERROR(use_device());
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return cuda_status(err, where("cudaHostAlloc(" + std::to_string(bytes) + " bytes)"));
    }
    return ptr;
  }
  void free_pinned(void* ptr) noexcept override {
    log_release_error(cudaFreeHost(ptr), "cudaFreeHost");
  }

  Result<std::string> pci_bus_id() override {
    char buf[32] = {};
    const cudaError_t err = cudaDeviceGetPCIBusId(buf, sizeof(buf), device_);
    if (err != cudaSuccess) return cuda_status(err, where("cudaDeviceGetPCIBusId"));
    return std::string(buf);
  }

  Result<StreamHandle> create_stream() override {
    KVTIER_RETURN_IF_ERROR(use_device());
    cudaStream_t s = nullptr;
    const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess) return cuda_status(err, where("cudaStreamCreateWithFlags"));
    return StreamHandle{s};
  }
  void destroy_stream(StreamHandle stream) noexcept override {
    log_release_error(cudaStreamDestroy(static_cast<cudaStream_t>(stream.raw)),
                      "cudaStreamDestroy");
  }

  Result<EventHandle> create_event() override {
    KVTIER_RETURN_IF_ERROR(use_device());
    cudaEvent_t e = nullptr;
    const cudaError_t err =
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync);
    if (err != cudaSuccess) return cuda_status(err, where("cudaEventCreateWithFlags"));
    return EventHandle{e};
  }
  void destroy_event(EventHandle event) noexcept override {
    log_release_error(cudaEventDestroy(static_cast<cudaEvent_t>(event.raw)), "cudaEventDestroy");
  }

  Status record_event(EventHandle event, StreamHandle stream) override {
    return cuda_status(
        cudaEventRecord(static_cast<cudaEvent_t>(event.raw), static_cast<cudaStream_t>(stream.raw)),
        where("cudaEventRecord"));
  }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    return cuda_status(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.raw),
                                           static_cast<cudaEvent_t>(event.raw), 0),
                       where("cudaStreamWaitEvent"));
  }
  Status synchronize_event(EventHandle event) override {
    return cuda_status(cudaEventSynchronize(static_cast<cudaEvent_t>(event.raw)),
                       where("cudaEventSynchronize"));
  }
  Status synchronize_stream(StreamHandle stream) override {
    return cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.raw)),
                       where("cudaStreamSynchronize"));
  }

  Status copy_async(std::span<const CopySegment> segments, CopyKind kind,
                    StreamHandle stream) override {
    if (segments.empty()) return Status();
    auto s = static_cast<cudaStream_t>(stream.raw);
    const cudaMemcpyKind k =
        kind == CopyKind::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (segments.size() == 1 || !batch_supported_) {
      for (const CopySegment& seg : segments) {
        const cudaError_t err = cudaMemcpyAsync(seg.dst, seg.src, seg.bytes, k, s);
        if (err != cudaSuccess) {
          return cuda_status(err,
                             where("cudaMemcpyAsync(" + std::to_string(seg.bytes) + " bytes)"));
        }
      }
      return Status();
    }
#if CUDART_VERSION >= 12080
    // One call for many pages: the driver plans the whole batch, instead of one launch per page.
    std::vector<void*> dsts(segments.size());
    std::vector<const void*> srcs(segments.size());
    std::vector<std::size_t> sizes(segments.size());
    for (std::size_t i = 0; i < segments.size(); ++i) {
      dsts[i] = segments[i].dst;
      srcs[i] = segments[i].src;
      sizes[i] = segments[i].bytes;
    }
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    std::size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                 segments.size(), &attr, &attr_index, 1, s);
#else
    std::size_t fail_index = 0;
    const cudaError_t err =
        cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                             segments.size(), &attr, &attr_index, 1, &fail_index, s);
#endif
    if (err == cudaErrorNotSupported || err == cudaErrorInvalidValue) {
      // Older drivers: remember and fall back to one copy per segment.
      cudaGetLastError();
      batch_supported_ = false;
      log_once(LogLevel::kInfo, "cuda.batch_copy",
               "cudaMemcpyBatchAsync unavailable (" + cuda_error_text(err) +
                   "): one cudaMemcpyAsync per segment");
      return copy_async(segments, kind, stream);
    }
    return cuda_status(
        err, where("cudaMemcpyBatchAsync(" + std::to_string(segments.size()) + " segments)"));
#else
    batch_supported_ = false;
    return copy_async(segments, kind, stream);
#endif
  }

  Status encode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                            StreamHandle stream) override {
    return run_codec(pages, format, stream, /*encode=*/true);
  }
  Status decode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                            StreamHandle stream) override {
    return run_codec(pages, format, stream, /*encode=*/false);
  }

 private:
  // One launch per kMaxPages pages: the page pointers travel in the kernel's parameters, so
  // nothing is allocated or uploaded per job. Host pages are used through their UVA mapping
  // (pinned with cudaHostAllocMapped, so the host pointer is the device pointer).
  Status run_codec(std::span<const CopySegment> pages, const PageFormat& format,
                   StreamHandle stream, bool encode) {
    if (pages.empty()) return Status();
    KVTIER_RETURN_IF_ERROR(use_device());
    auto s = static_cast<cudaStream_t>(stream.raw);
    kernels::PageCodecBatch batch;
    batch.wide = format.geometry.dtype;
    batch.half_elems = format.half_elems();
    for (std::size_t i = 0; i < pages.size(); i += kernels::PageCodecBatch::kMaxPages) {
      const std::size_t n =
          std::min<std::size_t>(kernels::PageCodecBatch::kMaxPages, pages.size() - i);
      batch.count = static_cast<uint32_t>(n);
      for (std::size_t j = 0; j < n; ++j) {
        batch.src[j] = pages[i + j].src;
        batch.dst[j] = pages[i + j].dst;
      }
      const cudaError_t err = encode ? kernels::cuda::launch_encode_pages_fp8(batch, s)
                                     : kernels::cuda::launch_decode_pages_fp8(batch, s);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return cuda_status(err, where(std::string(encode ? "fp8 encode" : "fp8 decode") + " of " +
                                      std::to_string(n) + " pages"));
      }
    }
    return Status();
  }

  Status use_device() { return cuda_status(cudaSetDevice(device_), where("cudaSetDevice")); }
  std::string where(const std::string& call) const {
    return call + " on device " + std::to_string(device_);
  }

  const int device_;
  std::atomic<bool> batch_supported_{true};
};

}  // namespace

bool cuda_compiled_in() { return true; }

Result<std::shared_ptr<DeviceApi>> open_cuda_device(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (is_no_gpu(err)) return unavailable("no usable GPU: " + cuda_error_text(err));
    return cuda_status(err, "cudaGetDeviceCount");
  }
  if (count == 0) return unavailable("no usable GPU: the CUDA runtime reports 0 devices");
  if (device < 0 || device >= count) {
    return invalid_argument("tiers.hbm.device " + std::to_string(device) + " does not exist (" +
                            std::to_string(count) + " CUDA device(s))");
  }
  const cudaError_t set = cudaSetDevice(device);
  if (set != cudaSuccess) return cuda_status(set, "cudaSetDevice(" + std::to_string(device) + ")");
  return std::shared_ptr<DeviceApi>(std::make_shared<CudaDeviceApi>(device));
}

}  // namespace kvtier
