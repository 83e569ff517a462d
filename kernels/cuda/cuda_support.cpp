#include "kernels/cuda/cuda_support.hpp"

#include <string>
#include <utility>

#include "kvtier/log.hpp"

namespace kvtier::kernels::cuda {
namespace {

// Destructors cannot return errors; they log, except for the runtime unloading at exit.
void log_release_failure(cudaError_t err, const char* what) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  log_once(LogLevel::kWarn, std::string("cuda-release-") + what,
           std::string("releasing a CUDA ") + what + " failed: " + cudaGetErrorName(err) + " (" +
               cudaGetErrorString(err) + ")");
}

}  // namespace

bool is_no_gpu_error(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
}

Status cuda_status(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return ok_status();
  std::string msg(what);
  msg += ": ";
  msg += cudaGetErrorName(err);
  msg += " (";
  msg += cudaGetErrorString(err);
  msg += ")";
  if (is_no_gpu_error(err)) return unavailable(std::move(msg));
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(std::move(msg));
  if (err == cudaErrorInvalidValue) return invalid_argument(std::move(msg));
  return internal_error(std::move(msg));
}

Status gpu_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return cuda_status(err, "probing for a GPU");
  }
  if (count == 0) return unavailable("probing for a GPU: no CUDA device");
  return ok_status();
}

Result<int> multiprocessor_count() {
  int device = 0;
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  int sms = 0;
  KVTIER_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "reading SM count"));
  return sms;
}

// --- DeviceBuffer ------------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes) {
  DeviceBuffer buf;
  if (bytes == 0) return buf;
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaMalloc(&buf.ptr_, bytes),
                                     "cudaMalloc of " + std::to_string(bytes) + " bytes"));
  buf.bytes_ = bytes;
  return buf;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  if (ptr_ != nullptr) log_release_failure(cudaFree(ptr_), "device buffer");
  ptr_ = nullptr;
  bytes_ = 0;
}

// --- CudaStream --------------------------------------------------------------------------------

Result<CudaStream> CudaStream::create() {
  CudaStream s;
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking),
                                     "cudaStreamCreate"));
  return s;
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() { reset(); }

void CudaStream::reset() noexcept {
  if (stream_ != nullptr) log_release_failure(cudaStreamDestroy(stream_), "stream");
  stream_ = nullptr;
}

Status CudaStream::synchronize() const {
  return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

// --- CudaEvent ---------------------------------------------------------------------------------

Result<CudaEvent> CudaEvent::create() {
  CudaEvent e;
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e.event_), "cudaEventCreate"));
  return e;
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() { reset(); }

void CudaEvent::reset() noexcept {
  if (event_ != nullptr) log_release_failure(cudaEventDestroy(event_), "event");
  event_ = nullptr;
}

Status CudaEvent::record(cudaStream_t stream) const {
  return cuda_status(cudaEventRecord(event_, stream), "cudaEventRecord");
}

Result<float> CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(event_), "cudaEventSynchronize"));
  float ms = 0.0f;
  KVTIER_RETURN_IF_ERROR(
      cuda_status(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime"));
  return ms;
}

Status copy_to_device(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  KVTIER_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                  "copy of " + std::to_string(bytes) + " bytes to the device"));
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

Status copy_to_host(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  KVTIER_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                  "copy of " + std::to_string(bytes) + " bytes to the host"));
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace kvtier::kernels::cuda
