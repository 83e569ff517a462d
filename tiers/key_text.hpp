// key_text: a block key as 32 lower-case hex digits (hi then lo), and hex64 a 64-bit value
// (a checksum, a store id) as 16, for messages from tiers/.
//
// The same spelling as kvtier::to_string(BlockKey), which is defined in scheduler/ — a library
// tiers/ must not link (dependencies point one way) — so tiers/ formats keys here.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "kvtier/block_key.hpp"

namespace kvtier {

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string key_text(const BlockKey& key) { return hex64(key.hi) + hex64(key.lo); }

}  // namespace kvtier
