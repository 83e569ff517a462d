// CUDA resources for kernels/ and its users: move-only RAII handles for device memory, streams
// and events, the mapping from cudaError_t to Status, and "is there a GPU at all".
//
// Handles own exactly one driver object; destructors are noexcept, release it and log (once) a
// failure other than cudaErrorCudartUnloading, which is normal at process exit. They are not
// thread-safe objects (one owner), but distinct handles may be used from distinct threads.
// Rejected: a shared pool or caching allocator here; the tiers own HBM arenas and reuse them, these
// handles are for tests, benchmarks and the few scratch buffers kernels need.
//
// Everything is declared only when the build has CUDA (KVTIER_HAVE_CUDA).
#pragma once

#if defined(KVTIER_HAVE_CUDA)

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"

namespace kvtier::kernels::cuda {

// cudaErrorNoDevice and cudaErrorInsufficientDriver: no usable GPU on this machine.
bool is_no_gpu_error(cudaError_t err);

// OK, or a Status naming `what` and the CUDA error (`unavailable` for "no GPU").
Status cuda_status(cudaError_t err, std::string_view what);

// OK when at least one GPU can be used; unavailable (with the reason) otherwise.
Status gpu_available();

// Streaming multiprocessors of the current device (for work splitting).
Result<int> multiprocessor_count();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(std::size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  void reset() noexcept;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

class CudaStream {
 public:
  CudaStream() = default;
  static Result<CudaStream> create();  // non-blocking with respect to the legacy default stream
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  Status synchronize() const;

 private:
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  static Result<CudaEvent> create();  // with timing, for benchmarks
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }
  Status record(cudaStream_t stream) const;
  // Milliseconds from `start` to this event (both recorded and complete).
  Result<float> elapsed_ms_since(const CudaEvent& start) const;

 private:
  void reset() noexcept;
  cudaEvent_t event_ = nullptr;
};

// Synchronous helpers for tests and benchmarks (they block the calling thread).
Status copy_to_device(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
Status copy_to_host(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_HAVE_CUDA
