// What the paths of an NVMe store hold, read without writing anything, and what opening the store
// would do with each: the operator's view before or after replacing a drive
// (`kvtier-bench check --store`).
//
// Each path is opened read-only and classified as the open classifies it (classify_store_path);
// describe_store_files() then says, file by file, what it holds and what the open's own plan
// (plan_store_open, nvme_open_plan.hpp) does with it. What no dry run can know is how carrying
// the plan out goes: a format write that fails leaves that file out of service instead.
#pragma once

#include <string>
#include <vector>

#include "kvtier/types.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/nvme_open_plan.hpp"

namespace kvtier {

// Reads what each of `paths` holds through `io`; writes, creates and formats nothing.
std::vector<StoreFileReport> inspect_store_files(IoBackend& io,
                                                 const std::vector<std::string>& paths);

// One line per file, "tiers.nvme.paths[i] <path>: <what it holds>; <what opening does>", for a
// store of the configured page `format`, opened O_DIRECT or not.
std::string describe_store_files(const std::vector<StoreFileReport>& reports,
                                 const PageFormat& format, bool direct_io);

}  // namespace kvtier
