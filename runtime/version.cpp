#include "kvtier/version.hpp"

namespace kvtier {

std::string_view version() { return KVTIER_VERSION_STRING; }

}  // namespace kvtier
