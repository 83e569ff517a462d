#include "tiers/device_api.hpp"

#include "kvtier/log.hpp"

namespace kvtier {

Result<std::shared_ptr<DeviceApi>> select_hbm_device(const HbmTierConfig& config) {
  if (config.backend == HbmBackend::kEmulated) return std::shared_ptr<DeviceApi>();
  auto device = open_cuda_device(config.device);
  if (device.ok()) return std::move(device).value();
  if (config.backend == HbmBackend::kCuda) {
    return std::move(device).status().with_context("tiers.hbm.backend is cuda but device " +
                                                   std::to_string(config.device) +
                                                   " cannot be used");
  }
  if (device.status().code() != StatusCode::kUnavailable) return std::move(device).status();
  log_once(LogLevel::kInfo, "tiers.hbm.emulated",
           "no GPU (" + device.status().message() + "): HBM tier emulated in host memory");
  return std::shared_ptr<DeviceApi>();
}

Result<DeviceBuffer> DeviceBuffer::allocate(std::shared_ptr<DeviceApi> api, Kind kind,
                                            std::size_t bytes) {
  if (!api) return invalid_argument("DeviceBuffer::allocate without a device");
  auto ptr = kind == Kind::kDevice ? api->allocate_device(bytes) : api->allocate_pinned(bytes);
  if (!ptr.ok()) return std::move(ptr).status();
  DeviceBuffer buffer;
  buffer.api_ = std::move(api);
  buffer.kind_ = kind;
  buffer.ptr_ = *ptr;
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    api_ = std::move(other.api_);
    kind_ = other.kind_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (ptr_ != nullptr && api_) {
    if (kind_ == Kind::kDevice) {
      api_->free_device(ptr_);
    } else {
      api_->free_pinned(ptr_);
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
  api_.reset();
}

Result<DeviceStream> DeviceStream::create(std::shared_ptr<DeviceApi> api) {
  if (!api) return invalid_argument("DeviceStream::create without a device");
  auto handle = api->create_stream();
  if (!handle.ok()) return std::move(handle).status();
  DeviceStream stream;
  stream.api_ = std::move(api);
  stream.handle_ = *handle;
  return stream;
}

DeviceStream& DeviceStream::operator=(DeviceStream&& other) noexcept {
  if (this != &other) {
    reset();
    api_ = std::move(other.api_);
    handle_ = std::exchange(other.handle_, StreamHandle{});
  }
  return *this;
}

void DeviceStream::reset() noexcept {
  if (handle_.raw != nullptr && api_) api_->destroy_stream(handle_);
  handle_ = StreamHandle{};
  api_.reset();
}

Result<DeviceEvent> DeviceEvent::create(std::shared_ptr<DeviceApi> api) {
  if (!api) return invalid_argument("DeviceEvent::create without a device");
  auto handle = api->create_event();
  if (!handle.ok()) return std::move(handle).status();
  DeviceEvent event;
  event.api_ = std::move(api);
  event.handle_ = *handle;
  return event;
}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    reset();
    api_ = std::move(other.api_);
    handle_ = std::exchange(other.handle_, EventHandle{});
  }
  return *this;
}

void DeviceEvent::reset() noexcept {
  if (handle_.raw != nullptr && api_) api_->destroy_event(handle_);
  handle_ = EventHandle{};
  api_.reset();
}

}  // namespace kvtier
