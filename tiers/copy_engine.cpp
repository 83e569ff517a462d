// CopyEngine is an interface; its implementations live in host_copy_engine.cpp and
// cuda_copy_engine.cpp. This file anchors the ordering helpers shared by both.
#include "tiers/copy_engine.hpp"

namespace kvtier {

static_assert(other_direction(CopyDirection::kHbmToHost) == CopyDirection::kHostToHbm);
static_assert(copy_link(CopyDirection::kHostToHbm) == Link::kHostToHbm);

}  // namespace kvtier
