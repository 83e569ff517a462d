#include "runtime/stats_fields.hpp"

#include <algorithm>

namespace kvtier {
namespace {

constexpr StatsField scalar(std::string_view name, uint64_t RuntimeStats::*field) {
  return StatsField{name, field, nullptr};
}
constexpr StatsField per_tier(std::string_view name,
                              std::array<uint64_t, kNumTiers> RuntimeStats::*field) {
  return StatsField{name, nullptr, field};
}

constexpr StatsField kFields[] = {
    scalar("lookup_tokens", &RuntimeStats::lookup_tokens),
    per_tier("hit_tokens", &RuntimeStats::hit_tokens),
    per_tier("used_bytes", &RuntimeStats::used_bytes),
    per_tier("capacity_bytes", &RuntimeStats::capacity_bytes),
    per_tier("promotions", &RuntimeStats::promotions),
    per_tier("demotions", &RuntimeStats::demotions),
    per_tier("evictions", &RuntimeStats::evictions),
    scalar("recompute_tokens", &RuntimeStats::recompute_tokens),
    scalar("stall_nanos", &RuntimeStats::stall_nanos),
    scalar("late_prefetches", &RuntimeStats::late_prefetches),
    per_tier("hinted_loads", &RuntimeStats::hinted_loads),
    per_tier("hinted_loads_reused", &RuntimeStats::hinted_loads_reused),
    scalar("failed_loads", &RuntimeStats::failed_loads),
    scalar("checksum_failures", &RuntimeStats::checksum_failures),
    scalar("io_errors", &RuntimeStats::io_errors),
    scalar("nvme_recovered_blocks", &RuntimeStats::nvme_recovered_blocks),
    scalar("open_sequences", &RuntimeStats::open_sequences),
    scalar("pinned_prefix_blocks", &RuntimeStats::pinned_prefix_blocks),
};

// RuntimeStats holds only such fields: a member added there and not here changes its size.
constexpr std::size_t kFieldBytes = [] {
  std::size_t bytes = 0;
  for (const StatsField& f : kFields) bytes += f.scalar != nullptr ? 8 : 8 * kNumTiers;
  return bytes;
}();
static_assert(sizeof(RuntimeStats) == kFieldBytes,
              "a RuntimeStats field is missing from runtime/stats_fields.cpp");

}  // namespace

std::span<const StatsField> runtime_stats_fields() { return kFields; }

const StatsField* find_stats_field(std::string_view name) {
  const auto it = std::ranges::find(kFields, name, &StatsField::name);
  return it == std::end(kFields) ? nullptr : &*it;
}

}  // namespace kvtier
