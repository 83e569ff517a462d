// DeviceApi in a build without CUDA: there is never a GPU, so the HBM tier is emulated.
#include "tiers/device_api.hpp"

namespace kvtier {

bool cuda_compiled_in() { return false; }

Result<std::shared_ptr<DeviceApi>> open_cuda_device(int device) {
  return unavailable("kvtier was built without CUDA (device " + std::to_string(device) +
                     " requested)");
}

}  // namespace kvtier
