// C++ view of the kvtier version (see version.h for the macros).
#pragma once

#include <string_view>

#include "kvtier/version.h"

namespace kvtier {

// "MAJOR.MINOR.PATCH" of the linked library.
std::string_view version();

}  // namespace kvtier
