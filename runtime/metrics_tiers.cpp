#include "runtime/metrics_tiers.hpp"

namespace kvtier {
namespace {

OccupancyProbe arena_probe(const FrameArena* arena) {
  if (arena == nullptr) return {};
  return [arena] { return TierOccupancy{arena->used_bytes(), arena->capacity_bytes()}; };
}

}  // namespace

std::array<OccupancyProbe, kNumTiers> tier_occupancy_probes(const TierStack& tiers) {
  std::array<OccupancyProbe, kNumTiers> probes;
  probes[tier_index(Tier::kHbm)] = arena_probe(tiers.hbm.get());
  probes[tier_index(Tier::kHost)] = arena_probe(tiers.host.get());
  if (const NvmeStore* nvme = tiers.nvme.get(); nvme != nullptr) {
    const uint64_t extent_bytes = nvme->layout().extent_bytes;
    probes[tier_index(Tier::kNvme)] = [nvme, extent_bytes] {
      return TierOccupancy{nvme->used_blocks() * extent_bytes,
                           nvme->capacity_blocks() * extent_bytes};
    };
  }
  return probes;
}

MetricsSources runtime_metrics_sources(const SchedulerStats* scheduler, const TierStack& tiers) {
  MetricsSources sources;
  sources.scheduler = scheduler;
  sources.transfer = tiers.stats.get();
  sources.occupancy = tier_occupancy_probes(tiers);
  return sources;
}

}  // namespace kvtier
