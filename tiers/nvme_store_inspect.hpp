// What the paths of an NVMe store hold, read without writing anything: the operator's view before
// or after replacing a drive (`kvtier-bench check --store`).
//
// Each path is opened read-only and its first 4 KiB read (buffered, so no alignment is needed): a
// file of a kvtier store (which one, which file, how many extents), blank (empty, or zeros there:
// a new or discarded drive), missing (and whether its directory is a mount point), unreadable,
// or something else. describe_store_files() then says, file by file, what opening the store
// does with each, in the words of the rules of nvme_store.hpp ("Opening without a file",
// "Replacing a drive"); the store tests open stores in each of these states.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tiers/io_backend.hpp"
#include "tiers/nvme_format.hpp"

namespace kvtier {

struct StoreFileReport {
  enum class Holds { kStoreFile, kBlank, kMissing, kUnreadable, kOther };
  std::string path;
  Holds holds = Holds::kOther;
  bool block_device = false;
  std::optional<Superblock> superblock;  // kStoreFile
  bool mount_point = false;              // kMissing: its directory is a mount point
  std::string detail;                    // kUnreadable: the error; kOther: what it is
};

// Reads what each of `paths` holds through `io`; writes, creates and formats nothing.
std::vector<StoreFileReport> inspect_store_files(IoBackend& io,
                                                 const std::vector<std::string>& paths);

// One line per file, "tiers.nvme.paths[i] <path>: <what it holds>; <what opening does>".
// `fingerprint`: store_fingerprint of the configured page format; a store file of another is
// refused.
std::string describe_store_files(const std::vector<StoreFileReport>& reports, uint64_t fingerprint);

}  // namespace kvtier
