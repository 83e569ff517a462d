// The fields of RuntimeStats by name, for the bindings that expose them by name: the Python
// stats() dict and the C kvt_runtime_counter. One table, so that a counter added to RuntimeStats
// is named once and reaches both; the C struct kvt_stats, fixed by the ABI, keeps the fields it
// had.
//
// A field is a single value (`scalar`) or one per tier (`per_tier`, indexed by tier_index); its
// name is the RuntimeStats member's.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvtier/kvtier.hpp"

namespace kvtier {

struct StatsField {
  std::string_view name;
  uint64_t RuntimeStats::*scalar = nullptr;
  std::array<uint64_t, kNumTiers> RuntimeStats::*per_tier = nullptr;
};

// Every field of RuntimeStats, in declaration order.
std::span<const StatsField> runtime_stats_fields();
// The field called `name`, or nullptr.
const StatsField* find_stats_field(std::string_view name);

}  // namespace kvtier
