// `kvtier-bench check`: load and validate the configuration, open each tier's frame or extent
// allocator at the size the configuration gives it, audit them, and print the summary. This is the
// self-check `make run` performs; it touches no device and creates no file. With --store it also
// reads what each NVMe store path holds (nothing is written) and says what opening the store does
// with it: the operator's view around a drive replacement.
#include <memory>
#include <ostream>
#include <vector>

#include "bench/kvtier_bench/command.hpp"
#include "runtime/config_describe.hpp"
#include "runtime/config_sizing.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/nvme_format.hpp"
#include "tiers/nvme_store_inspect.hpp"

namespace kvtier::bench {
namespace {

class CheckCommand final : public Command {
 public:
  std::string_view name() const override { return "check"; }
  std::string_view summary() const override {
    return "validate the configuration, size each tier's allocator and print a summary";
  }
  std::string_view description() const override {
    return "Loads the configuration (the embedded default unless --config or KVTIER_CONFIG_FILE\n"
           "names a file; KVTIER_<SECTION>__<KEY> variables and --set override keys), validates\n"
           "it, opens the frame allocators of the HBM and host tiers and the extent allocator of\n"
           "the NVMe store at the sizes it gives, audits them, and prints what it found. Opens no\n"
           "device and creates no file. With --store it also reads the first 4 KiB of each\n"
           "tiers.nvme.paths entry (read-only) and says what it holds and what opening the store\n"
           "does with it: used, formatted (blank), created (missing at a mount point), opened\n"
           "without (missing elsewhere, unreadable), or refused.";
  }
  void add_options(OptionParser& p) override {
    p.add_flag("store", "also say what each NVMe store path holds (read-only)", &store_);
  }

  int run(const CommandContext& ctx) override {
    ctx.out << "kvtier configuration check: " << ctx.config_source << "\n\n"
            << describe_config(ctx.config) << "\n";
    const TierSizing sizing = size_tiers(ctx.config);

    auto hbm = open_frames("hbm", sizing.hbm_frames, ctx);
    auto host = open_frames("host", sizing.host_frames, ctx);
    if (!hbm || !host) return kExitFailure;

    if (sizing.nvme_enabled) {
      std::vector<uint32_t> per_file;
      for (uint64_t n : sizing.nvme_extents_per_file) per_file.push_back(static_cast<uint32_t>(n));
      auto nvme = ExtentAllocator::create(std::move(per_file), sizing.nvme_extent_bytes,
                                          sizing.nvme_first_offset);
      if (!nvme.ok()) return fail("nvme", nvme.status(), ctx);
      Status audit = (*nvme)->audit();
      if (!audit.ok()) return fail("nvme", audit, ctx);
      ctx.out << "allocator nvme: " << (*nvme)->capacity() << " extents in "
              << (*nvme)->file_count() << ((*nvme)->file_count() == 1 ? " file" : " files") << ", "
              << (*nvme)->free_count() << " free, audit ok\n";
      if (store_) {
        ctx.out << "nvme store files:\n"
                << describe_store_files(
                       inspect_store_files(*posix_io_backend(), ctx.config.tiers.nvme.paths),
                       ctx.config.tiers.nvme_page_format(ctx.config.model.geometry),
                       ctx.config.tiers.nvme.direct_io);
      }
    } else {
      ctx.out << "allocator nvme: disabled\n";
    }
    ctx.out << "check ok\n";
    return kExitOk;
  }

 private:
  static std::unique_ptr<FrameAllocator> open_frames(std::string_view tier, uint64_t frames,
                                                     const CommandContext& ctx) {
    auto allocator = FrameAllocator::create(static_cast<uint32_t>(frames));
    if (!allocator.ok()) {
      fail(tier, allocator.status(), ctx);
      return nullptr;
    }
    Status audit = (*allocator)->audit();
    if (!audit.ok()) {
      fail(tier, audit, ctx);
      return nullptr;
    }
    ctx.out << "allocator " << tier << ": " << (*allocator)->capacity() << " frames, "
            << (*allocator)->free_count() << " free, audit ok\n";
    return std::move(allocator).value();
  }

  bool store_ = false;

  static int fail(std::string_view tier, const Status& status, const CommandContext& ctx) {
    ctx.err << "kvtier-bench check: tier " << tier << ": " << status.to_string() << "\n";
    return kExitFailure;
  }
};

}  // namespace

std::unique_ptr<Command> make_check_command() { return std::make_unique<CheckCommand>(); }

}  // namespace kvtier::bench
