// How opening an NVMe store treats each of its paths, stated once for the open and its dry run.
//
// Two steps. classify_store_path says what a path holds, reading it and writing nothing: a file
// of a kvtier store, blank (empty, or zeros where the superblock goes: a new or discarded drive),
// missing, unreadable, a damaged kvtier superblock, or something else. plan_store_open then
// decides, from what all of them hold, what opening does with each: use it, format it, create
// and format it, open without it (out of service, probed later), or refuse to open. NvmeStore's
// open carries the plan out; describe_store_files (`kvtier-bench check --store`) reports it.
//
// The rules (nvme_store.hpp says why):
// - No path holds a store file (a new store): missing paths are created, blank files and block
//   devices are formatted; a regular file holding anything else, an unreadable path or a damaged
//   superblock refuses the open.
// - Some path does (an existing store, that of the first one): every store file must belong to
//   it, in its place in the list, for the configured page format, with its layout, an alignment
//   its device takes (with O_DIRECT), and all the bytes its superblock describes. A blank file or
//   device in place of a lost one is formatted as that file when it holds an extent and its
//   sectors suit the store; a missing one is created where its directory is a mount point; else,
//   as an unreadable one or one whose superblock is damaged, the store opens without it. Anything
//   else refuses the open: a device name may name another drive after a replacement, so a device
//   holding anything is never formatted into an existing store (blkdiscard it first).
//
// What a plan cannot know is how carrying it out goes: a format write that fails, or a file just
// created whose sectors do not suit the store, leaves that file out of service (the open logs
// why), and a new store needs capacity_bytes to give each file an extent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/nvme_format.hpp"
#include "tiers/scoped_fd.hpp"

namespace kvtier {

// A Status kept as data, in reports and plans that are copied and dropped freely: a Status must
// be looked at before it goes (checked statuses), a Reason need not. status() makes the Status
// again, code and all.
struct Reason {
  StatusCode code = StatusCode::kOk;
  std::string message;

  Reason() = default;
  Reason(const Status& s) : code(s.code()), message(s.message()) {}  // NOLINT: implicit by design
  bool ok() const { return code == StatusCode::kOk; }
  Status status() const { return Status(code, message); }
  std::string to_string() const { return status().to_string(); }
};

struct StoreFileReport {
  enum class Holds { kStoreFile, kBlank, kMissing, kUnreadable, kDamaged, kOther };
  std::string path;
  Holds holds = Holds::kOther;
  FileInfo info;                         // all but kMissing and an unopenable kUnreadable
  std::optional<Superblock> superblock;  // kStoreFile
  // kMissing: OK where a lost file may be created (may_create_lost_file); kUnreadable: the error;
  // kDamaged: what is wrong with the superblock; kOther: what the path holds.
  Reason detail;
};

// What `path` holds: `opened` is how opening it went (kNotFound: missing), read through `io`
// (its stat and first kSuperblockBytes, into a buffer aligned for O_DIRECT). Writes nothing.
StoreFileReport classify_store_path(IoBackend& io, const std::string& path,
                                    const Result<ScopedFd>& opened);

// OK where a lost file of an existing store may be created at `path`: its directory is a mount
// point, so its drive's file system is there, not the one beneath (which a path missing because
// that file system did not mount would otherwise get). Else why not.
Status may_create_lost_file(IoBackend& io, const std::string& path);

// How many whole extents of `extent_bytes` a block device of `device_bytes` holds from
// `first_offset` on.
uint64_t extents_on_device(uint64_t device_bytes, uint64_t first_offset, uint64_t extent_bytes);

// How many of `count` extents a blank file or device gets in place of a lost file: all of them
// for a regular file (allocated to size), as many as fit from `first_offset` on for a device.
// kFailedPrecondition, saying why, when its sectors do not suit `layout` (under O_DIRECT) or it
// holds no extent.
Result<uint64_t> replacement_extents(const FileInfo& info, const std::string& path,
                                     const ExtentLayout& layout, uint64_t count,
                                     uint64_t first_offset, bool direct_io);

// Why file `index` of a store of `count` files, as `r` found it (its superblock and stat), is not
// a usable file of the store whose first file has superblock `first` and extent `layout`: another
// page format, store or place in the list, an inconsistent layout, an alignment its device
// refuses (under O_DIRECT), fewer bytes than its superblock describes. OK when it is usable. The
// open checks each store file so, and a probe the file it would readmit.
Reason check_store_file(const StoreFileReport& r, std::size_t index, std::size_t count,
                        const Superblock& first, const ExtentLayout& layout,
                        const PageFormat& format, bool direct_io);

enum class FileFate : uint8_t {
  kUse,          // a file of the store, in its place
  kFormat,       // formatted: a new store's file, or a blank one in place of a lost file
  kCreate,       // missing: created and formatted
  kOpenWithout,  // the store opens without it, out of service (probed later)
  kRefuse,       // the store does not open
};

struct FilePlan {
  FileFate fate = FileFate::kRefuse;
  // kFormat in place of a lost file: the extents it gets (replacement_extents).
  uint64_t extents = 0;
  // kOpenWithout and kRefuse: why, of the file ("holds ...", "is truncated: ...").
  Reason why;
  std::string name;  // "tiers.nvme.paths[i] (path)"

  // `why`, naming the file: as the open reports it.
  Status named_why() const;
};

struct StoreOpenPlan {
  // An existing store: the superblock of its first file, and its extent layout.
  std::optional<Superblock> first;
  ExtentLayout layout;
  std::vector<FilePlan> files;

  // Why the store does not open (the first file's reason to refuse, named); OK when it opens.
  Status refusal() const;
};

// The plan for a store over `files` (in config order), for the configured `format`, with its
// files opened O_DIRECT or not.
StoreOpenPlan plan_store_open(const std::vector<StoreFileReport>& files, const PageFormat& format,
                              bool direct_io);

// "tiers.nvme.paths[index]", as errors name a file's config entry.
std::string store_path_key(std::size_t index);

}  // namespace kvtier
