// How opening an NVMe store treats each of its paths (see the header).
#include "tiers/nvme_open_plan.hpp"

#include <algorithm>
#include <span>

#include "tiers/aligned_bytes.hpp"
#include "tiers/key_text.hpp"

namespace kvtier {
namespace {

using Holds = StoreFileReport::Holds;

// A store file of an existing store whose first file has superblock `first` and `layout`.
FilePlan plan_store_file(const StoreFileReport& r, std::size_t index, std::size_t count,
                         const Superblock& first, const ExtentLayout& layout,
                         const PageFormat& format, bool direct_io) {
  FilePlan p;
  p.why = check_store_file(r, index, count, first, layout, format, direct_io);
  p.fate = p.why.ok() ? FileFate::kUse : FileFate::kRefuse;
  return p;
}

// A file without a superblock of this store's, when some other file has one.
FilePlan plan_lost_file(const StoreFileReport& r, std::size_t index, const Superblock& first,
                        const ExtentLayout& layout, bool direct_io) {
  FilePlan p;
  switch (r.holds) {
    case Holds::kBlank: {
      Result<uint64_t> fits = replacement_extents(r.info, r.path, layout, first.extent_count,
                                                  first.first_offset, direct_io);
      if (fits.ok()) {
        p.fate = FileFate::kFormat;
        p.extents = *fits;
      } else {
        p.fate = FileFate::kOpenWithout;
        p.why = fits.status().with_context("not formatted in place of the file it lost");
      }
      return p;
    }
    case Holds::kMissing:
      p.fate = r.detail.ok() ? FileFate::kCreate : FileFate::kOpenWithout;
      p.why = r.detail;
      return p;
    case Holds::kUnreadable:
    case Holds::kDamaged:
      // Never formatted over: a probe finds it as it is, until someone discards the drive.
      p.fate = FileFate::kOpenWithout;
      p.why = r.detail;
      return p;
    case Holds::kOther:
    case Holds::kStoreFile: break;
  }
  p.fate = FileFate::kRefuse;
  p.why = failed_precondition(
      "holds neither a kvtier store nor zeros in its first " + std::to_string(kSuperblockBytes) +
      " bytes; refusing to " +
      (r.info.block_device
           ? "format it as file " + std::to_string(index) + " of store " + hex64(first.store_id) +
                 ": if it is the drive that replaced that file, discard it first "
                 "(blkdiscard)"
           : "overwrite it"));
  return p;
}

// A file of a new store: no file holds a store's superblock.
FilePlan plan_new_file(const StoreFileReport& r) {
  FilePlan p;
  switch (r.holds) {
    case Holds::kMissing: p.fate = FileFate::kCreate; return p;
    case Holds::kBlank: p.fate = FileFate::kFormat; return p;
    case Holds::kOther:
      if (r.info.block_device) {
        p.fate = FileFate::kFormat;
        return p;
      }
      p.fate = FileFate::kRefuse;
      p.why = failed_precondition("is not empty (" + std::to_string(r.info.size) +
                                  " bytes) and is not a kvtier store; refusing to overwrite it");
      return p;
    case Holds::kUnreadable:
    case Holds::kDamaged:
    case Holds::kStoreFile: break;
  }
  p.fate = FileFate::kRefuse;
  p.why = r.detail;
  return p;
}

}  // namespace

std::string store_path_key(std::size_t index) {
  return "tiers.nvme.paths[" + std::to_string(index) + "]";
}

Reason check_store_file(const StoreFileReport& r, std::size_t index, std::size_t count,
                        const Superblock& first, const ExtentLayout& layout,
                        const PageFormat& format, bool direct_io) {
  const Superblock& sb = *r.superblock;
  const Geometry stored = format.stored_geometry();
  if (sb.fingerprint != store_fingerprint(format) || !(sb.geometry == stored)) {
    const bool fp8_differs = sb.fingerprint != store_fingerprint(format) && sb.geometry == stored;
    return failed_precondition(
        "holds a kvtier store for geometry " + describe_geometry(sb.geometry) +
        (fp8_differs ? std::string(format.encodes() ? " without" : " with") + " per-page fp8 scales"
                     : std::string()) +
        " but the configured geometry is " + describe_page_format(format) +
        "; point tiers.nvme.paths elsewhere or remove the file");
  }
  if (sb.store_id != first.store_id || sb.file_count != count || sb.file_index != index) {
    return failed_precondition("is file " + std::to_string(sb.file_index) + " of " +
                               std::to_string(sb.file_count) + " of store " + hex64(sb.store_id) +
                               ", but is listed as file " + std::to_string(index) + " of " +
                               std::to_string(count) + " (store " + hex64(first.store_id) + ")");
  }
  Result<ExtentLayout> expect = ExtentLayout::make(format, sb.layout.io_align);
  if (!expect.ok()) {
    return expect.status();
  }
  if (expect->header_bytes != sb.layout.header_bytes ||
      expect->page_stride != sb.layout.page_stride ||
      expect->extent_bytes != sb.layout.extent_bytes || sb.first_offset != first.first_offset ||
      sb.layout.io_align != layout.io_align) {
    return data_loss("its superblock describes an inconsistent extent layout");
  }
  // Only a reported block size refuses a store: with an assumed one, a store written at a finer
  // alignment is used as it is (its I/O would fail, each one reported, were it wrong).
  if (direct_io && r.info.logical_block_known && sb.layout.io_align % r.info.logical_block != 0) {
    return failed_precondition("was written with " + std::to_string(sb.layout.io_align) +
                               "-byte alignment; its device needs " +
                               std::to_string(r.info.logical_block));
  }
  const uint64_t needed = sb.first_offset + sb.extent_count * sb.layout.extent_bytes;
  if (r.info.size < needed) {
    return data_loss("is truncated: " + std::to_string(r.info.size) +
                     " bytes, its superblock describes " + std::to_string(needed));
  }
  return Reason();
}

StoreFileReport classify_store_path(IoBackend& io, const std::string& path,
                                    const Result<ScopedFd>& opened) {
  StoreFileReport r;
  r.path = path;
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) {
    r.holds = Holds::kMissing;
    r.detail = may_create_lost_file(io, path);
    return r;
  }
  Result<FileInfo> info = opened.ok() ? io.stat(opened->get(), path) : opened.status();
  if (!info.ok()) {
    r.holds = Holds::kUnreadable;
    r.detail = info.status();
    return r;
  }
  r.info = *info;
  if (!r.info.block_device && r.info.size == 0) {
    r.holds = Holds::kBlank;
    return r;
  }
  if (!r.info.block_device && r.info.size < kSuperblockBytes) {
    r.holds = Holds::kOther;
    r.detail = not_found(std::to_string(r.info.size) + " bytes, too few for a superblock");
    return r;
  }
  AlignedBytes buf = aligned_bytes(4096, kSuperblockBytes);
  if (!buf) {
    r.holds = Holds::kUnreadable;
    r.detail = resource_exhausted("no memory for a superblock buffer");
    return r;
  }
  const Status read = io.read_at(opened->get(), path, buf.get(), kSuperblockBytes, 0);
  if (!read.ok()) {
    r.holds = Holds::kUnreadable;
    r.detail = read;
    return r;
  }
  const std::span<const std::byte> region(buf.get(), kSuperblockBytes);
  if (blank_superblock(region)) {
    r.holds = Holds::kBlank;
    return r;
  }
  Result<Superblock> sb = decode_superblock(region, path);
  if (sb.ok()) {
    r.holds = Holds::kStoreFile;
    r.superblock = *sb;
  } else if (sb.status().code() == StatusCode::kNotFound) {
    r.holds = Holds::kOther;
    r.detail = not_found("no kvtier superblock");
  } else {
    r.holds = Holds::kDamaged;
    r.detail = sb.status();
  }
  return r;
}

Status may_create_lost_file(IoBackend& io, const std::string& path) {
  const std::string dir = directory_of(path);
  Result<bool> mounted = io.is_mount_point(dir);
  if (!mounted.ok()) {
    return mounted.status().with_context("its directory cannot be looked at");
  }
  if (!*mounted) {
    return failed_precondition(
        "not created, since " + dir +
        " is not a mount point (its drive's file system may have failed to mount): mount the "
        "drive there, or create the file by hand, and the store formats it");
  }
  return Status();
}

uint64_t extents_on_device(uint64_t device_bytes, uint64_t first_offset, uint64_t extent_bytes) {
  return device_bytes > first_offset ? (device_bytes - first_offset) / extent_bytes : 0;
}

Result<uint64_t> replacement_extents(const FileInfo& info, const std::string& path,
                                     const ExtentLayout& layout, uint64_t count,
                                     uint64_t first_offset, bool direct_io) {
  if (direct_io && info.logical_block_known && layout.io_align % info.logical_block != 0) {
    return failed_precondition(path + " has " + std::to_string(info.logical_block) +
                               "-byte sectors; the store is aligned to " +
                               std::to_string(layout.io_align));
  }
  if (!info.block_device) return count;  // allocated to size
  const uint64_t fits = extents_on_device(info.size, first_offset, layout.extent_bytes);
  if (fits == 0) {
    return failed_precondition(path + " (" + std::to_string(info.size) +
                               " bytes) cannot hold one extent");
  }
  return std::min(count, fits);
}

Status FilePlan::named_why() const { return why.status().with_context(name); }

Status StoreOpenPlan::refusal() const {
  for (const FilePlan& f : files) {
    if (f.fate == FileFate::kRefuse) return f.named_why();
  }
  return Status();
}

StoreOpenPlan plan_store_open(const std::vector<StoreFileReport>& files, const PageFormat& format,
                              bool direct_io) {
  StoreOpenPlan plan;
  const auto first = std::find_if(files.begin(), files.end(),
                                  [](const StoreFileReport& r) { return r.superblock; });
  if (first == files.end()) {
    for (const StoreFileReport& r : files) plan.files.push_back(plan_new_file(r));
  } else {
    plan.first = *first->superblock;
    Result<ExtentLayout> layout = ExtentLayout::make(format, plan.first->layout.io_align);
    if (layout.ok()) plan.layout = *layout;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const StoreFileReport& r = files[i];
      if (!layout.ok()) {
        plan.files.push_back({FileFate::kRefuse, 0, Reason(layout.status()), ""});
      } else if (r.superblock) {
        plan.files.push_back(
            plan_store_file(r, i, files.size(), *plan.first, *layout, format, direct_io));
      } else {
        plan.files.push_back(plan_lost_file(r, i, *plan.first, *layout, direct_io));
      }
    }
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    plan.files[i].name = store_path_key(i) + " (" + files[i].path + ")";
  }
  return plan;
}

}  // namespace kvtier
