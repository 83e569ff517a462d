// What the paths of an NVMe store hold, and what opening the store does with each (see the header).
#include "tiers/nvme_store_inspect.hpp"

#include <fcntl.h>

#include <algorithm>
#include <sstream>

#include "tiers/aligned_bytes.hpp"
#include "tiers/key_text.hpp"

namespace kvtier {
namespace {

StoreFileReport inspect_one(IoBackend& io, const std::string& path) {
  StoreFileReport r;
  r.path = path;
  auto fd = io.open(path, O_RDONLY, 0);
  if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) {
    r.holds = StoreFileReport::Holds::kMissing;
    const Result<bool> mounted = io.is_mount_point(directory_of(path));
    r.mount_point = mounted.ok() && *mounted;
    return r;
  }
  auto info = fd.ok() ? io.stat(fd->get(), path) : Result<FileInfo>(fd.status());
  if (!info.ok()) {
    r.holds = StoreFileReport::Holds::kUnreadable;
    r.detail = info.status().to_string();
    return r;
  }
  r.block_device = info->block_device;
  if (!info->block_device && info->size == 0) {
    r.holds = StoreFileReport::Holds::kBlank;
    return r;
  }
  if (!info->block_device && info->size < kSuperblockBytes) {
    r.detail = std::to_string(info->size) + " bytes, too few for a superblock";
    return r;
  }
  AlignedBytes buf = aligned_bytes(4096, kSuperblockBytes);
  if (!buf) {
    r.holds = StoreFileReport::Holds::kUnreadable;
    r.detail = "no memory for a superblock buffer";
    return r;
  }
  const Status read = io.read_at(fd->get(), path, buf.get(), kSuperblockBytes, 0);
  if (!read.ok()) {
    r.holds = StoreFileReport::Holds::kUnreadable;
    r.detail = read.to_string();
    return r;
  }
  const std::span<const std::byte> region(buf.get(), kSuperblockBytes);
  if (blank_superblock(region)) {
    r.holds = StoreFileReport::Holds::kBlank;
    return r;
  }
  Result<Superblock> sb = decode_superblock(region, path);
  if (sb.ok()) {
    r.holds = StoreFileReport::Holds::kStoreFile;
    r.superblock = *sb;
    return r;
  }
  r.detail =
      sb.status().code() == StatusCode::kNotFound ? "no kvtier superblock" : sb.status().message();
  return r;
}

}  // namespace

std::vector<StoreFileReport> inspect_store_files(IoBackend& io,
                                                 const std::vector<std::string>& paths) {
  std::vector<StoreFileReport> out;
  for (const std::string& path : paths) out.push_back(inspect_one(io, path));
  return out;
}

std::string describe_store_files(const std::vector<StoreFileReport>& reports,
                                 uint64_t fingerprint) {
  using Holds = StoreFileReport::Holds;
  const auto first = std::find_if(reports.begin(), reports.end(),
                                  [](const StoreFileReport& r) { return r.superblock; });
  const bool exists = first != reports.end();
  const std::string store = exists ? "store " + hex64(first->superblock->store_id) : "";
  std::ostringstream out;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const StoreFileReport& r = reports[i];
    out << "tiers.nvme.paths[" << i << "] " << r.path << ": ";
    switch (r.holds) {
      case Holds::kStoreFile: {
        const Superblock& sb = *r.superblock;
        out << "file " << sb.file_index << " of " << sb.file_count << " of store "
            << hex64(sb.store_id) << ", " << sb.extent_count << " extents";
        if (sb.fingerprint != fingerprint) {
          out << " for " << describe_geometry(sb.geometry)
              << ", another geometry or page format than configured: the store does not open";
        } else if (sb.store_id != first->superblock->store_id) {
          out << "; not of " << store << ": the store does not open";
        } else if (sb.file_index != i || sb.file_count != reports.size()) {
          out << "; listed as file " << i << " of " << reports.size()
              << ": the store does not open";
        } else {
          out << "; used";
        }
        break;
      }
      case Holds::kBlank:
        out << (r.block_device ? "blank device" : "blank file") << "; "
            << (exists ? "formatted as file " + std::to_string(i) + " of " + store +
                             " when the store opens, or by its next probe"
                       : "formatted when the store is made");
        break;
      case Holds::kMissing:
        if (!exists) {
          out << "missing; created when the store is made";
        } else if (r.mount_point) {
          out << "missing, its directory a mount point; created and formatted as file " << i
              << " of " << store;
        } else {
          out << "missing, its directory not a mount point; the store opens without it until "
                 "the file is created (or its drive mounted there)";
        }
        break;
      case Holds::kUnreadable:
        out << "unreadable (" << r.detail << "); "
            << (exists && reports.size() > 1 ? "the store opens without it"
                                             : "the store does not open");
        break;
      case Holds::kOther:
        out << "holds something else (" << r.detail << "); "
            << (r.block_device && !exists ? "formatted when the store is made"
                : r.block_device          ? "not formatted in place of a lost file (blkdiscard it "
                                            "first): the store does not open"
                                          : "the store does not open");
        break;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace kvtier
