// NvmeStore: a blank file or device in place of a lost one (see the header's "Replacing a
// drive"). At open of an existing store, each listed file that holds no superblock but may take
// one is formatted as that file of the store, empty, and is in service at once: a blank one (a new
// or discarded drive, a file created or preallocated by hand), or a missing one whose directory
// is a mount point (its drive's file system is mounted there). A missing file anywhere else is not
// created: its drive's file system may have failed to mount, and the file would fill whatever
// file system holds the mount point. A file that cannot take the format (too small, a sector the
// store's alignment does not fit, a failed write) is opened without, out of service, as a dead
// one would be.
//
// A drive replaced while the store runs is found by the probes of its file
// (nvme_store_readmit.cpp): a probe that finds the file blank (its superblock region all zeros, or
// a regular file emptied or just created where its drive is mounted) writes the store's superblock
// for that file in the probe's place, like any request (timeout, refusal while the drive holds
// requests unanswered), and a success readmits the file with every extent, the old drive's
// bad-sector marks forgotten. A block device's probe goes through a descriptor of its own, the
// name opened afresh, which the file adopts when the probe readmits it (Op::adopt_fd): its device
// number cannot tell a replaced drive from the removed one.
#include <fcntl.h>

#include <algorithm>
#include <string>

#include "kvtier/log.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/nvme_worker.hpp"

namespace kvtier {

bool NvmeStore::may_create_lost_file(const std::string& path, std::string& why_not) {
  const std::string dir = directory_of(path);
  Result<bool> mounted = options_.backend->is_mount_point(dir);
  if (!mounted.ok()) {
    why_not = "its directory cannot be looked at: " + mounted.status().message();
    return false;
  }
  if (!*mounted) {
    why_not = "not created, since " + dir +
              " is not a mount point (its drive's file system may have failed to mount): mount "
              "the drive there, or create the file by hand, and the store formats it";
    return false;
  }
  return true;
}

uint64_t NvmeStore::replacement_extents(const FileInfo& info, const std::string& path,
                                        uint64_t count, uint64_t first_offset,
                                        std::string& why_not) const {
  if (direct_io_ && info.logical_block_known && layout_.io_align % info.logical_block != 0) {
    why_not = path + " has " + std::to_string(info.logical_block) +
              "-byte sectors; the store is aligned to " + std::to_string(layout_.io_align);
    return 0;
  }
  if (!info.block_device) return count;  // allocated to size
  const uint64_t fits =
      info.size > first_offset ? (info.size - first_offset) / layout_.extent_bytes : 0;
  if (fits == 0) {
    why_not = path + " (" + std::to_string(info.size) + " bytes) cannot hold one extent";
  }
  return std::min(count, fits);
}

Status NvmeStore::replace_lost_files(std::vector<OpenedFile>& opened, const Superblock& first) {
  IoBackend& io = *options_.backend;
  for (uint32_t i = 0; i < opened.size(); ++i) {
    OpenedFile& o = opened[i];
    if (o.sb) continue;
    const std::string key = path_key(i);
    if (o.missing) {
      std::string why_not;
      if (!may_create_lost_file(o.path, why_not)) {
        o.absent += "; " + why_not;
        continue;
      }
      auto fd = open_store_path(o.path, key, /*create=*/true);
      auto info = fd.ok() ? io.stat(fd->get(), o.path) : Result<FileInfo>(fd.status());
      if (!info.ok()) {
        o.absent = info.status().message();
        continue;
      }
      // Two paths naming one missing file (a/b and a//b) would both create it.
      KVTIER_RETURN_IF_ERROR(check_listed_once(opened, i, o.path, *info));
      o.fd = std::move(fd).value();
      o.info = *info;
      o.missing = false;
      o.blank = true;
      o.absent.clear();
    }
    if (!o.blank) continue;  // unreadable: opened without
    std::string why_not;
    const uint64_t count =
        replacement_extents(o.info, o.path, first.extent_count, first.first_offset, why_not);
    Status s = count == 0 ? failed_precondition(why_not) : Status();
    if (s.ok() && !o.info.block_device) {
      s = io.allocate(o.fd.get(), o.path, first.first_offset + count * layout_.extent_bytes);
    }
    const Superblock sb = superblock_of(i, count, first.first_offset);
    if (s.ok()) s = write_superblock(o.fd.get(), o.path, sb);
    if (!s.ok()) {
      o.absent = "formatting it in place of the store's lost file failed: " + s.to_string();
      continue;
    }
    o.sb = sb;
    o.formatted_now = true;
    stats_->files_replaced.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "NVMe store: " + key + " (" + o.path + ") was blank; formatted as file " +
                             std::to_string(i) + " of store " + hex64(store_id_) + " with " +
                             std::to_string(count) +
                             " extents, empty, in place of the file it lost");
  }
  return Status();
}

Result<SharedFd> NvmeStore::reopen_for_probe_locked(uint32_t file) {
  File& f = files_[file];
  IoBackend& io = *options_.backend;
  const int flags = O_RDWR | (direct_io_ ? O_DIRECT : 0);
  auto fd = io.open(f.path, flags, 0);
  if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) {
    // Never the old descriptor: its file is gone from the path, and what it writes is lost.
    std::string why_not;
    if (!may_create_lost_file(f.path, why_not)) return fd.status().with_context(why_not);
    fd = io.open(f.path, flags | O_CREAT, 0600);
    if (!fd.ok()) return fd.status();
  } else if (!fd.ok()) {
    // The path cannot be opened now (EACCES, EIO): the probe tries the file the store holds.
    if (!f.fd.valid()) return fd.status();
    return SharedFd();
  }
  if (f.fd.valid()) {
    Result<FileInfo> now = io.stat(fd->get(), f.path);
    if (now.ok() && now->block_device) {
      return SharedFd(std::move(fd).value());  // adopted if it readmits
    }
    Result<FileInfo> before = io.stat(f.fd.get(), f.path);
    if (before.ok() && now.ok() && same_file(*before, *now)) {
      return SharedFd();  // the same file
    }
  }
  adopt_locked(file, SharedFd(std::move(fd).value()));
  return SharedFd();
}

void NvmeStore::adopt_locked(uint32_t file, SharedFd fd) {
  // Operations made before hold the old descriptor: it closes when the last of them ends.
  files_[file].fd = std::move(fd);
}

bool NvmeStore::found_blank(const Op& probe, const Status& read) const {
  if (read.ok()) {
    return blank_superblock(std::span<const std::byte>(probe.probe_buffer.get(), kSuperblockBytes));
  }
  // A regular file emptied or just created: its read ended at the end of the file.
  Result<FileInfo> info = options_.backend->stat(probe.fd.get(), files_[probe.file].path);
  return info.ok() && !info->block_device && info->size == 0;
}

Status NvmeStore::post_format(const Op& probe) {
  const uint32_t file = probe.file;
  const File& f = files_[file];  // its path and extent count, which never change
  KVTIER_ASSIGN_OR_RETURN(FileInfo info, options_.backend->stat(probe.fd.get(), f.path));
  KVTIER_ASSIGN_OR_RETURN(ExtentLocation first, place(extents_->first_extent_of(file)));
  std::string why_not;
  // A block device smaller than the lost one holds fewer extents: it is formatted with those.
  const uint64_t fits = replacement_extents(info, f.path, f.extent_count, first.offset, why_not);
  if (fits == 0) return failed_precondition(f.path + " is blank but " + why_not);
  const uint64_t size = first.offset + fits * layout_.extent_bytes;
  if (!info.block_device && info.size < size) {
    KVTIER_RETURN_IF_ERROR(options_.backend->allocate(probe.fd.get(), f.path, size));
  }
  AlignedBytes superblock = new_probe_buffer();
  if (!superblock) return resource_exhausted("no memory for a superblock buffer");
  std::fill_n(superblock.get(), probe_bytes(), std::byte{0});
  encode_superblock(superblock_of(file, fits, first.offset),
                    std::span<std::byte>(superblock.get(), kSuperblockBytes));
  log(LogLevel::kWarn, "NVMe store: " + f.path +
                           " is blank (a replaced drive?): formatting it as file " +
                           std::to_string(file) + " of store " + hex64(store_id_) + " with " +
                           std::to_string(fits) + " extents");
  post_probe_write(probe, std::move(superblock), /*formats=*/true, fits);
  return Status();
}

}  // namespace kvtier
