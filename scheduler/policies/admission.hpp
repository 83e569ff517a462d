// NvmeAdmission: which blocks may take an NVMe extent (policies.admission.nvme_min_hits).
//
// NVMe writes cost device endurance and link time; a block that was never reused is most likely
// never reused again (on the public Mooncake trace, 58 % of blocks are used once, and a block hit
// once is twice as likely to come back as a new one). With nvme_min_hits = N > 0 only blocks
// reused at least N times are written there; the others are dropped when they leave host memory.
// The tier's evictor gets the final say through Evictor::admit (bypass), after this filter.
//
// Stateless and cheap; one instance is shared by the placement and the write path.
#pragma once

#include <cstdint>

#include "kvtier/config.hpp"

namespace kvtier {

class NvmeAdmission {
 public:
  explicit NvmeAdmission(const AdmissionConfig& config) : min_hits_(config.nvme_min_hits) {}
  explicit NvmeAdmission(uint32_t min_hits) : min_hits_(min_hits) {}

  // `hits`: AccessStats::hits of the block.
  bool admits(uint32_t hits) const { return hits >= min_hits_; }
  uint32_t min_hits() const { return min_hits_; }

 private:
  uint32_t min_hits_;
};

}  // namespace kvtier
