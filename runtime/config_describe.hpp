// A human summary of a Config: what `kvtier-bench check` prints and what a runtime logs at start.
//
// Geometry with page and block bytes, each tier with its backend, capacity, the frames or extents
// that capacity holds (runtime/config_sizing.hpp), watermarks and NVMe paths, then the policies
// and metrics. Plain text, one item per line, no trailing spaces; stable enough to grep in tests
// but not a format to parse (the YAML is the machine-readable form). Pure; thread-safe.
#pragma once

#include <string>

#include "kvtier/config.hpp"

namespace kvtier {

std::string describe_config(const Config& config);

}  // namespace kvtier
