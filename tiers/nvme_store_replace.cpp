// NvmeStore: a blank file or device in place of a lost one (see the header's "Replacing a
// drive"). At open of an existing store, each listed file that holds no superblock but may take
// one, as the open's plan says (nvme_open_plan.hpp), is formatted as that file of the store,
// empty, and is in service at once: a blank one (a new or discarded drive, a file created or
// preallocated by hand), or a missing one whose directory is a mount point (its drive's file
// system is mounted there). A missing file anywhere else is not created: its drive's file system
// may have failed to mount, and the file would fill whatever file system holds the mount point. A
// file that cannot take the format (too small, a sector the store's alignment does not fit, a
// failed write) is opened without, out of service, as a dead one would be.
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
#include "tiers/nvme_open_plan.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/nvme_worker.hpp"

namespace kvtier {

Status NvmeStore::replace_lost_files(std::vector<OpenedFile>& opened, const StoreOpenPlan& plan) {
  const Superblock& first = *plan.first;
  for (uint32_t i = 0; i < opened.size(); ++i) {
    OpenedFile& o = opened[i];
    const FilePlan& p = plan.files[i];
    if (p.fate == FileFate::kOpenWithout) o.absent = p.named_why().message();
    if (p.fate != FileFate::kFormat && p.fate != FileFate::kCreate) continue;
    Status s = Status();
    uint64_t count = p.extents;
    if (p.fate == FileFate::kCreate) {
      Result<CreatedPath> created = create_path(i);
      if (created.ok()) {
        KVTIER_RETURN_IF_ERROR(take_created(opened, i, std::move(created).value()));
        // Its sectors are known only now.
        Result<uint64_t> fits =
            replacement_extents(o.report.info, o.report.path, layout_, first.extent_count,
                                first.first_offset, direct_io_);
        s = fits.status();
        count = fits.ok() ? *fits : 0;
      } else {
        s = created.status();
      }
    }
    if (s.ok() && !o.report.info.block_device) {
      s = options_.backend->allocate(o.fd.get(), o.report.path,
                                     first.first_offset + count * layout_.extent_bytes);
    }
    const Superblock sb = superblock_of(i, count, first.first_offset);
    if (s.ok()) s = write_superblock(o.fd.get(), o.report.path, sb);
    const std::string name = path_key(i) + " (" + o.report.path + ")";
    if (!s.ok()) {
      o.absent =
          name + ": formatting it in place of the store's lost file failed: " + s.to_string();
      continue;
    }
    o.report.superblock = sb;
    o.formatted_now = true;
    stats_->files_replaced.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn,
        "NVMe store: " + name + " was " + (p.fate == FileFate::kCreate ? "missing" : "blank") +
            "; formatted as file " + std::to_string(i) + " of store " + hex64(store_id_) +
            " with " + std::to_string(count) + " extents, empty, in place of the file it lost");
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
    Status may = may_create_lost_file(io, f.path);
    if (!may.ok()) return fd.status().with_context(may.message());
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
  // A block device smaller than the lost one holds fewer extents: it is formatted with those.
  Result<uint64_t> replacing =
      replacement_extents(info, f.path, layout_, f.extent_count, first.offset, direct_io_);
  if (!replacing.ok()) return replacing.status().with_context(f.path + " is blank, not formatted");
  const uint64_t fits = *replacing;
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
