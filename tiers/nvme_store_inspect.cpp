// What the paths of an NVMe store hold, and what opening the store does with each (see the header).
#include "tiers/nvme_store_inspect.hpp"

#include <fcntl.h>

#include <sstream>

#include "tiers/key_text.hpp"

namespace kvtier {
namespace {

using Holds = StoreFileReport::Holds;

std::string what_it_holds(const StoreFileReport& r) {
  switch (r.holds) {
    case Holds::kStoreFile: {
      const Superblock& sb = *r.superblock;
      return "file " + std::to_string(sb.file_index) + " of " + std::to_string(sb.file_count) +
             " of store " + hex64(sb.store_id) + ", " + std::to_string(sb.extent_count) +
             " extents";
    }
    case Holds::kBlank: return r.info.block_device ? "blank device" : "blank file";
    case Holds::kMissing: return "missing";
    case Holds::kUnreadable: return "unreadable (" + r.detail.to_string() + ")";
    case Holds::kDamaged: return "a damaged kvtier superblock (" + r.detail.message + ")";
    case Holds::kOther:
      return std::string(r.info.block_device ? "a device that holds" : "holds") +
             " something else (" + r.detail.message + ")";
  }
  return "";
}

std::string what_opening_does(const StoreFileReport& r, const FilePlan& p, std::size_t index,
                              const StoreOpenPlan& plan) {
  // An unreadable file or a damaged superblock is its own reason, said already.
  const bool said = r.holds == Holds::kUnreadable || r.holds == Holds::kDamaged;
  const std::string why = said ? "" : ": " + p.why.message;
  const std::string as_file =
      plan.first ? "as file " + std::to_string(index) + " of store " + hex64(plan.first->store_id)
                 : "";
  switch (p.fate) {
    case FileFate::kUse: return "used";
    case FileFate::kFormat:
      return plan.first ? "formatted " + as_file + " when the store opens, or by its next probe"
                        : "formatted when the store is made";
    case FileFate::kCreate:
      return plan.first ? "created and formatted " + as_file : "created when the store is made";
    case FileFate::kOpenWithout: return "the store opens without it, out of service" + why;
    case FileFate::kRefuse: return "the store does not open" + why;
  }
  return "";
}

}  // namespace

std::vector<StoreFileReport> inspect_store_files(IoBackend& io,
                                                 const std::vector<std::string>& paths) {
  std::vector<StoreFileReport> out;
  for (const std::string& path : paths) {
    out.push_back(classify_store_path(io, path, io.open(path, O_RDONLY, 0)));
  }
  return out;
}

std::string describe_store_files(const std::vector<StoreFileReport>& reports,
                                 const PageFormat& format, bool direct_io) {
  const StoreOpenPlan plan = plan_store_open(reports, format, direct_io);
  std::ostringstream out;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    out << store_path_key(i) << " " << reports[i].path << ": " << what_it_holds(reports[i]) << "; "
        << what_opening_does(reports[i], plan.files[i], i, plan) << "\n";
  }
  return out.str();
}

}  // namespace kvtier
