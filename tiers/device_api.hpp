// DeviceApi: the seam between kvtier and the CUDA runtime.
//
// Everything tiers/ asks of a GPU — device and pinned allocations, streams, events, batched async
// copies, the PCI address for NUMA placement — goes through this interface, for two reasons: the
// CUDA runtime header stays out of every other file (so the CPU-only build and the CUDA build share
// all sources but one), and tests substitute a fake that runs the CUDA code paths on the CPU or
// fails chosen calls (allocation failures, copy errors) to check that kvtier degrades instead of
// crashing.
//
// `open_cuda_device` returns the real runtime, or kUnavailable with the reason when kvtier was
// built without CUDA, no driver is loaded (cudaErrorInsufficientDriver) or no device exists
// (cudaErrorNoDevice): callers treat that as "no GPU" and fall back to the emulated HBM tier.
//
// Handles are typed wrappers of the runtime's opaque pointers. The RAII owners below (DeviceBuffer,
// DeviceStream, DeviceEvent) are move-only, keep the DeviceApi alive, and release in a noexcept
// destructor that logs failures (cudaErrorCudartUnloading at process exit is normal and silent).
// All methods are thread-safe as the CUDA runtime is; none takes a kvtier lock.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier {

struct StreamHandle {
  void* raw = nullptr;  // cudaStream_t
};
struct EventHandle {
  void* raw = nullptr;  // cudaEvent_t
};

enum class CopyKind : uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };

struct CopySegment {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  virtual std::string_view name() const = 0;  // "cuda", or a test double's name
  virtual int device() const = 0;

  // Device memory (cudaMalloc): kResourceExhausted when the device is out of memory.
  virtual Result<void*> allocate_device(std::size_t bytes) = 0;
  virtual void free_device(void* ptr) noexcept = 0;
  // Pinned, portable host memory (cudaHostAlloc).
  virtual Result<void*> allocate_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* ptr) noexcept = 0;

  // "0000:3b:00.0", for placing host memory on the NUMA node nearest the GPU.
  virtual Result<std::string> pci_bus_id() = 0;

  // A non-blocking stream (never the legacy default stream).
  virtual Result<StreamHandle> create_stream() = 0;
  virtual void destroy_stream(StreamHandle stream) noexcept = 0;
  // Events without timing; synchronize() on them blocks the thread rather than spinning.
  virtual Result<EventHandle> create_event() = 0;
  virtual void destroy_event(EventHandle event) noexcept = 0;
  virtual Status record_event(EventHandle event, StreamHandle stream) = 0;
  virtual Status stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  virtual Status synchronize_event(EventHandle event) = 0;
  virtual Status synchronize_stream(StreamHandle stream) = 0;

  // Enqueues every segment on `stream`, in stream order as a whole (segments of one call may run
  // in any order among themselves), using one batched call where the runtime offers it.
  virtual Status copy_async(std::span<const CopySegment> segments, CopyKind kind,
                            StreamHandle stream) = 0;

  // Enqueues the fp8 page codec on `stream`, one segment per page (`bytes`: the page as computed).
  // Encode reads a page as computed from device memory and writes it in `format` into pinned host
  // memory; decode reads `format` from pinned host memory and writes the page as computed into
  // device memory. A page holding NaN or inf is written with a NaN scale and zeros.
  virtual Status encode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                                    StreamHandle stream) = 0;
  virtual Status decode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                                    StreamHandle stream) = 0;
};

// True when this build has the CUDA runtime linked in.
bool cuda_compiled_in();

// The CUDA runtime on `device`, or kUnavailable (see above).
Result<std::shared_ptr<DeviceApi>> open_cuda_device(int device);

// Resolves tiers.hbm.backend: kEmulated -> nullptr; kAuto -> the GPU when present, else nullptr
// and one log line saying HBM is emulated; kCuda -> the GPU or kUnavailable.
Result<std::shared_ptr<DeviceApi>> select_hbm_device(const HbmTierConfig& config);

// --- RAII owners -------------------------------------------------------------------------------

class DeviceBuffer {
 public:
  enum class Kind : uint8_t { kDevice, kPinned };

  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(std::shared_ptr<DeviceApi> api, Kind kind,
                                       std::size_t bytes);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer() { reset(); }

  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  Kind kind() const { return kind_; }
  void reset() noexcept;

 private:
  std::shared_ptr<DeviceApi> api_;
  Kind kind_ = Kind::kDevice;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

class DeviceStream {
 public:
  DeviceStream() = default;
  static Result<DeviceStream> create(std::shared_ptr<DeviceApi> api);
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  DeviceStream(DeviceStream&& other) noexcept { *this = std::move(other); }
  DeviceStream& operator=(DeviceStream&& other) noexcept;
  ~DeviceStream() { reset(); }

  StreamHandle get() const { return handle_; }
  void reset() noexcept;

 private:
  std::shared_ptr<DeviceApi> api_;
  StreamHandle handle_;
};

class DeviceEvent {
 public:
  DeviceEvent() = default;
  static Result<DeviceEvent> create(std::shared_ptr<DeviceApi> api);
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  DeviceEvent(DeviceEvent&& other) noexcept { *this = std::move(other); }
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  ~DeviceEvent() { reset(); }

  EventHandle get() const { return handle_; }
  void reset() noexcept;

 private:
  std::shared_ptr<DeviceApi> api_;
  EventHandle handle_;
};

}  // namespace kvtier
