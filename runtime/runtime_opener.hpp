// detail::RuntimeOpener: Runtime::open with the tier stack's seams (TierStackOptions: the device,
// host memory, the NVMe store's I/O backend) replaced. Runtime::open is this with the real ones;
// tests open a whole runtime over the fault-injecting I/O backend with it, to fail real NVMe I/O
// underneath the engine's calls.
#pragma once

#include <memory>

#include "kvtier/kvtier.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier::detail {

struct RuntimeOpener {
  static Result<std::unique_ptr<Runtime>> open(const Config& config, RuntimeOptions options,
                                               TierStackOptions tier_options);
};

}  // namespace kvtier::detail
