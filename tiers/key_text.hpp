// key_text: a block key as 32 lower-case hex digits (hi then lo), for messages from tiers/.
//
// The same spelling as kvtier::to_string(BlockKey), which is defined in scheduler/ — a library
// tiers/ must not link (dependencies point one way) — so tiers/ formats keys here.
#pragma once

#include <cstdio>
#include <string>

#include "kvtier/block_key.hpp"

namespace kvtier {

inline std::string key_text(const BlockKey& key) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(key.hi),
                static_cast<unsigned long long>(key.lo));
  return buf;
}

}  // namespace kvtier
