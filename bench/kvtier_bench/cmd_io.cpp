// `kvtier-bench io`: the tiers' I/O paths against the baselines they should match, side by side
// in one run.
//
// NVMe: the store writes then reads `--size` bytes of whole blocks (the configured geometry's
// block, queue depth and I/O threads, the host pool registered as fixed buffers, checksums on) and
// fio does the same with ioengine=io_uring, direct=1, the same file size, block size and depth, on
// a file beside the store's. Runs alternate kvtier, fio, kvtier, fio... after one warm-up pass
// each (so both write into allocated, already-written blocks), and the median of each is reported.
// Copy: host pool <-> emulated HBM through the transfer engine, one block of scattered pages per
// transfer, against one memcpy of the same bytes; medians of alternating runs again.
// --gpu: the same copy measurement on the GPU — pinned host pool <-> device arena through the CUDA
// copy engine against one cudaMemcpyAsync of the same bytes, each direction.
//
// Progress and problems go to stderr; the result to stdout, as a table or one JSON object:
//   {"read": {"kvtier_mib_s", "fio_mib_s", "ratio"}, "write": {...}, "copy": {"kvtier_gib_s",
//    "memcpy_gib_s", "ratio"}, "block_bytes", "queue_depth", ...}
// and with --gpu: {"gpu": {"h2d": {"kvtier_gib_s", "cuda_gib_s", "ratio"}, "d2h": {...}}, ...}.
// A baseline that cannot run (fio missing) is reported as null, with the reason on stderr.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/kvtier_bench/command.hpp"
#include "bench/run/subprocess.hpp"
#include "runtime/config_size.hpp"
#include "tiers/device_api.hpp"
#include "tiers/hbm_arena.hpp"
#include "tiers/host_pool.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/transfer_engine.hpp"

namespace kvtier::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr uint64_t kMaxRuns = 1000;
// The CPU copy pass holds its bytes four times: emulated HBM, host pool, two memcpy buffers.
constexpr uint64_t kCopyCopies = 4;

struct IoOptions {
  bool json = false;
  bool gpu = false;
  bool skip_fio = false;
  bool sync_queue = false;
  std::string dir;                    // empty: beside the configured store
  uint64_t size = uint64_t{1} << 30;  // bytes of blocks per NVMe pass
  uint64_t copy_size = uint64_t{256} << 20;
  uint64_t runs = 3;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string json_number(std::optional<double> v) {
  if (!v) return "null";
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << *v;
  return s.str();
}

std::optional<double> ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b <= 0) return std::nullopt;
  return *a / *b;
}

BlockKey bench_key(uint64_t i) {
  return BlockKey{0xB0B0'0000'0000'0000ull ^ i, (0xBEEFull << 48) | i};
}

// --- NVMe: kvtier
// ---------------------------------------------------------------------------------

// One pass over `blocks` blocks at queue depth `qd`: slot s of the pool holds the pages of every
// block i with i % qd == s, and block i is submitted only after block i - qd completed.
Result<double> store_pass(NvmeStore& store, HostPool& pool, uint64_t blocks, uint32_t qd,
                          bool write, uint64_t key_base) {
  const uint32_t layers = store.geometry().layers;
  std::deque<Transfer> in_flight;
  std::vector<std::byte*> pages(layers);
  const double t0 = now_s();
  for (uint64_t i = 0; i < blocks; ++i) {
    if (in_flight.size() >= qd) {
      KVTIER_RETURN_IF_ERROR(in_flight.front().wait());
      in_flight.pop_front();
    }
    const uint32_t slot = static_cast<uint32_t>(i % qd);
    for (uint32_t l = 0; l < layers; ++l) pages[l] = pool.frame_address(slot * layers + l);
    if (write) {
      std::vector<const std::byte*> src(pages.begin(), pages.end());
      KVTIER_ASSIGN_OR_RETURN(Transfer t, store.write_block(bench_key(key_base + i), src));
      in_flight.push_back(std::move(t));
    } else {
      KVTIER_ASSIGN_OR_RETURN(Transfer t, store.read_block(bench_key(key_base + i), pages));
      in_flight.push_back(std::move(t));
    }
  }
  for (Transfer& t : in_flight) KVTIER_RETURN_IF_ERROR(t.wait());
  const double seconds = now_s() - t0;
  return static_cast<double>(blocks * store.geometry().block_bytes()) / kMiB / seconds;
}

// --- NVMe: fio
// -------------------------------------------------------------------------------------

// The "bw_bytes" of the "read" or "write" section of fio's JSON output.
std::optional<double> fio_bw_bytes(const std::string& json, const std::string& section) {
  // The section's key is followed by ": {"; the same word also appears as a value ("rw" : "write").
  const std::string key = "\"" + section + "\"";
  std::size_t at = json.find(key);
  while (at != std::string::npos) {
    const auto next = json.find_first_not_of(" \t\r\n", at + key.size());
    if (next != std::string::npos && json[next] == ':') {
      const auto brace = json.find_first_not_of(" \t\r\n", next + 1);
      if (brace != std::string::npos && json[brace] == '{') break;
    }
    at = json.find(key, at + 1);
  }
  if (at == std::string::npos) return std::nullopt;
  const auto bw = json.find("\"bw_bytes\"", at);
  if (bw == std::string::npos) return std::nullopt;
  const auto colon = json.find(':', bw);
  if (colon == std::string::npos) return std::nullopt;
  try {
    return std::stod(json.substr(colon + 1, 32));
  } catch (...) {
    return std::nullopt;
  }
}

// `file` as fio's --filename takes it: a colon separates file names there, "\:" is a colon.
std::string fio_filename(const std::string& file) {
  std::string out;
  for (const char c : file) {
    if (c == ':') out += '\\';
    out += c;
  }
  return out;
}

// fio without a shell: the file name is one argument, whatever it contains.
Result<double> fio_pass(const std::string& file, uint64_t bytes, uint64_t block, uint32_t qd,
                        bool write) {
  const std::string rw = write ? "write" : "read";
  const std::vector<std::string> argv = {"fio",
                                         "--name=kvtier-bench-io",
                                         "--filename=" + fio_filename(file),
                                         "--size=" + std::to_string(bytes),
                                         "--bs=" + std::to_string(block),
                                         "--iodepth=" + std::to_string(qd),
                                         "--ioengine=io_uring",
                                         "--direct=1",
                                         "--numjobs=1",
                                         "--rw=" + rw,
                                         "--output-format=json"};
  KVTIER_ASSIGN_OR_RETURN(run::ProgramResult r, run::run_program(argv, "", true));
  if (!r.ok()) {
    if (r.err.empty()) r.err = r.out;  // some fio errors go to stdout
    return unavailable("fio failed (" + r.describe(300) + ")");
  }
  auto bw = fio_bw_bytes(r.out, rw);
  if (!bw) return internal_error("no bw_bytes for " + rw + " in fio's output");
  return *bw / kMiB;
}

bool have_fio() { return run::program_on_path("fio"); }

// Removes the benchmark's files (and the directory, when this run created it and it is empty)
// on every way out of the command, early errors included.
class RemoveOnExit {
 public:
  RemoveOnExit() = default;
  ~RemoveOnExit() {
    for (const std::string& f : files_) ::unlink(f.c_str());
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  void file(std::string path) { files_.push_back(std::move(path)); }
  void dir(std::string path) { dir_ = std::move(path); }

 private:
  std::vector<std::string> files_;
  std::string dir_;
};

// The memory this process may use: physical memory, lowered by an address-space limit
// (ulimit -v) or a cgroup v2 memory.max (a container's limit, where the OOM killer strikes).
// 0 when unknown.
uint64_t usable_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t most = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  auto lower = [&most](uint64_t limit) {
    if (limit > 0 && (most == 0 || limit < most)) most = limit;
  };
  if (struct rlimit rl{}; ::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    lower(rl.rlim_cur);
  }
  if (std::ifstream in("/sys/fs/cgroup/memory.max"); in) {
    uint64_t limit = 0;
    if (in >> limit) lower(limit);  // "max" (no limit) does not parse
  }
  return most;
}

// --- Copy: emulated HBM <-> host pool vs memcpy
// ---------------------------------------------------

// Moves every frame of `pages` frames one way, one block (layers pages, scattered) per transfer,
// every transfer in flight at once. Returns GiB/s.
Result<double> engine_copy_pass(TransferEngine& engine, CopyDirection dir, uint32_t pages,
                                uint32_t layers, const std::vector<uint32_t>& perm,
                                std::size_t page_bytes) {
  std::vector<Transfer> ts;
  ts.reserve(pages / layers + 1);
  std::vector<FramePair> batch;
  const double t0 = now_s();
  for (uint32_t i = 0; i < pages; i += layers) {
    batch.clear();
    for (uint32_t k = i; k < std::min(pages, i + layers); ++k) batch.push_back({k, perm[k]});
    if (dir == CopyDirection::kHostToHbm) {
      for (FramePair& p : batch) std::swap(p.src, p.dst);
    }
    KVTIER_ASSIGN_OR_RETURN(Transfer t, engine.copy(dir, batch));
    ts.push_back(std::move(t));
  }
  for (Transfer& t : ts) KVTIER_RETURN_IF_ERROR(t.wait());
  return static_cast<double>(uint64_t{pages} * page_bytes) / kGiB / (now_s() - t0);
}

// --- The command
// ----------------------------------------------------------------------------------

class IoCommand final : public Command {
 public:
  std::string_view name() const override { return "io"; }
  std::string_view summary() const override {
    return "NVMe store vs fio, and tier copies vs memcpy (--gpu: vs cudaMemcpyAsync)";
  }
  std::string_view description() const override {
    return "Measures the NVMe store's block write and read throughput against fio (io_uring,\n"
           "direct I/O, same file size, block size and queue depth) and the transfer engine's\n"
           "host <-> emulated HBM copies against one memcpy of the same bytes, alternating runs\n"
           "and reporting medians. With --gpu it measures pinned host <-> device copies of the\n"
           "CUDA copy engine against one cudaMemcpyAsync of the same bytes instead. Files are\n"
           "created in --dir (default: beside tiers.nvme.paths[0]) and removed afterwards, also\n"
           "when the run fails. --size is at least 2 x queue depth blocks (256 MiB with the\n"
           "default geometry) and must fit the directory's free space twice (store and fio\n"
           "files); --copy-size must fit 4 times in the memory this process may use (emulated\n"
           "HBM, host pool, two memcpy buffers; with --gpu, twice for the pinned host pool).";
  }
  void add_options(OptionParser& p) override {
    p.add_flag("json", "print one JSON object instead of a table", &o_.json);
    p.add_flag("gpu", "measure pinned host <-> GPU copies against cudaMemcpyAsync", &o_.gpu);
    p.add_flag("skip-fio", "do not run fio (its figures are null)", &o_.skip_fio);
    p.add_flag("sync-queue",
               "the store's I/O through its synchronous fallback (preadv/pwritev on a pool of "
               "threads), as where io_uring is refused",
               &o_.sync_queue);
    p.add_string("dir", "DIR", "where the benchmark files go", &o_.dir);
    p.add_size("size", "BYTES",
               "bytes per NVMe pass (default 1GiB; at least 2 x queue depth blocks)", &o_.size);
    p.add_size("copy-size", "BYTES", "bytes per copy pass (default 256MiB)", &o_.copy_size);
    p.add_uint("runs", "N", "measured runs of each, 1 to 1000 (default 3; the median is reported)",
               &o_.runs);
  }

  int run(const CommandContext& ctx) override {
    if (o_.runs < 1 || o_.runs > kMaxRuns) {
      return usage(ctx, "--runs " + std::to_string(o_.runs) + ": must be from 1 to " +
                            std::to_string(kMaxRuns));
    }
    if (Status s = check_copy_size(ctx.config.model.geometry); !s.ok()) {
      return usage(ctx, s.message());
    }
    return o_.gpu ? run_gpu(ctx) : run_io(ctx);
  }

 private:
  int fail(const CommandContext& ctx, const std::string& what, const Status& s) {
    ctx.err << "kvtier-bench io: " << what << ": " << s.to_string() << "\n";
    return kExitFailure;
  }
  int usage(const CommandContext& ctx, const std::string& msg) {
    ctx.err << "kvtier-bench io: " << msg << "\n";
    return kExitUsage;
  }

  // Pages of --copy-size (at least one block of them).
  uint64_t copy_pages(const Geometry& g) const {
    return std::max<uint64_t>(o_.copy_size / g.page_bytes(), g.layers);
  }

  // The copy pass must fit in memory (an over-large request used to be OOM-killed after the NVMe
  // passes): the CPU pass holds its bytes 4 times, the GPU pass pins them once on the host.
  Status check_copy_size(const Geometry& g) const {
    const uint64_t memory = usable_memory_bytes();
    if (memory == 0) return ok_status();  // unknown: the arenas' fallbacks decide
    const uint64_t copies = o_.gpu ? 2 : kCopyCopies;
    const uint64_t most = memory / copies;
    const uint64_t pages = copy_pages(g);
    if (pages > most / g.page_bytes() || pages > UINT32_MAX) {
      return invalid_argument(
          "--copy-size " + format_size_approx(o_.copy_size) + " does not fit the " +
          format_size_approx(memory) + " of memory this process may use: the copy pass " +
          (o_.gpu ? "pins it in host memory (at most half the memory)"
                  : "holds it 4 times (emulated HBM, host pool, two memcpy buffers)") +
          "; use at most " + format_size_approx(most / g.page_bytes() * g.page_bytes()));
    }
    return ok_status();
  }

  int run_io(const CommandContext& ctx) {
    const Geometry& g = ctx.config.model.geometry;
    const NvmeTierConfig& nc = ctx.config.tiers.nvme;
    std::string dir = o_.dir;
    if (dir.empty()) {
      const std::string first = nc.paths.empty() ? "./.kvtier/x" : nc.paths[0];
      const auto slash = first.rfind('/');
      dir = slash == std::string::npos ? "." : first.substr(0, slash);
    }
    const uint32_t qd = nc.queue_depth;
    const uint64_t block = g.block_bytes();
    // At least two blocks per queue slot, so every pass keeps the queue full.
    const uint64_t min_blocks = 2 * uint64_t{qd};
    if (o_.size / block < min_blocks) {
      return usage(ctx, "--size " + format_size_approx(o_.size) + " is below the minimum of " +
                            format_size_approx(min_blocks * block) + " per pass (2 x queue depth " +
                            std::to_string(qd) + " blocks of " + format_size_approx(block) +
                            "; a smaller tiers.nvme.queue_depth lowers it)");
    }
    const uint64_t blocks = o_.size / block;
    const bool fio = !o_.skip_fio && have_fio();
    if (fio && dir.find("\\:") != std::string::npos) {
      return usage(ctx, "--dir " + dir +
                            ": fio cannot take a file name with a backslash before a colon; "
                            "choose another directory or --skip-fio");
    }

    RemoveOnExit cleanup;  // declared before the store and pool: runs after they are closed
    if (::mkdir(dir.c_str(), 0700) == 0) cleanup.dir(dir);
    const std::string store_file = dir + "/kvtier-bench-io.kvs";
    const std::string fio_file = dir + "/kvtier-bench-io.fio";
    ::unlink(store_file.c_str());
    ::unlink(fio_file.c_str());
    cleanup.file(store_file);
    cleanup.file(fio_file);
    if (struct statvfs fs{}; ::statvfs(dir.c_str(), &fs) == 0) {
      const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
      const uint64_t files = fio ? 2 : 1;
      const uint64_t slot = block + 64 * 1024;  // a block and its share of the store's headers
      if (blocks > free_bytes / files / slot) {
        return usage(ctx, "--size " + format_size_approx(o_.size) + " does not fit in " + dir +
                              ": " + std::to_string(files) + " file" + (files > 1 ? "s" : "") +
                              " of " + format_size_approx(o_.size) + " need more than its " +
                              format_size_approx(free_bytes) + " free");
      }
    }

    // Host pool: one block per queue slot, registered with io_uring by the store.
    HostTierConfig hc = ctx.config.tiers.host;
    hc.capacity_bytes = uint64_t{qd} * g.layers * FrameArena::frame_stride(g);
    auto pool = HostPool::create(hc, g, nullptr);
    if (!pool.ok()) return fail(ctx, "host pool", pool.status());
    if ((*pool)->frame_count() < uint64_t{qd} * g.layers) {
      return fail(ctx, "host pool",
                  resource_exhausted("got " + std::to_string((*pool)->frame_count()) +
                                     " frames; the queue depth of " + std::to_string(qd) +
                                     " needs " + std::to_string(uint64_t{qd} * g.layers)));
    }
    for (uint32_t f = 0; f < (*pool)->frame_count(); ++f) {
      std::byte* p = (*pool)->frame_address(f);
      for (std::size_t i = 0; i < (*pool)->frame_bytes(); ++i) p[i] = std::byte(i * 131 + f);
    }
    NvmeStoreOptions so;
    so.config = nc;
    so.config.paths = {store_file};
    so.config.capacity_bytes = (blocks + 1) * (block + 64 * 1024);
    so.fixed_buffers = {iovec{(*pool)->base(), (*pool)->region_bytes()}};
    if (o_.sync_queue) {
      PosixIoOptions po;
      po.io_uring = false;
      so.backend = posix_io_backend(po);
    }
    auto store = NvmeStore::create(g, std::move(so));
    if (!store.ok()) return fail(ctx, "NVMe store", store.status());
    NvmeStore& s = **store;

    if (!o_.skip_fio && !fio) ctx.err << "kvtier-bench io: fio not found; its figures are null\n";
    ctx.err << "io: " << blocks << " blocks of " << block << " bytes, queue depth " << qd << ", "
            << s.io_kind() << (s.fixed_buffers_active() ? " + fixed buffers" : "")
            << (s.direct_io() ? ", O_DIRECT" : ", buffered") << ", files in " << dir << "\n";

    std::vector<double> kw, kr, fw, fr;
    uint64_t key_base = 0;
    auto erase_all = [&] {
      for (uint64_t i = 0; i < blocks; ++i) s.erase(bench_key(key_base + i)).ignore();
      key_base += blocks;
    };
    // Warm-up: every block written once by each, so measured writes overwrite written blocks.
    auto warm = store_pass(s, **pool, blocks, qd, true, key_base);
    if (!warm.ok()) return fail(ctx, "warm-up write", warm.status());
    if (fio) {
      auto fw0 = fio_pass(fio_file, blocks * block, block, qd, true);
      if (!fw0.ok()) return fail(ctx, "fio warm-up", fw0.status());
    }
    for (uint64_t r = 0; r < o_.runs; ++r) {
      ctx.err << "io: run " << (r + 1) << "/" << o_.runs << "\n";
      erase_all();
      auto w = store_pass(s, **pool, blocks, qd, true, key_base);
      if (!w.ok()) return fail(ctx, "kvtier write", w.status());
      kw.push_back(*w);
      if (fio) {
        auto f = fio_pass(fio_file, blocks * block, block, qd, true);
        if (!f.ok()) return fail(ctx, "fio write", f.status());
        fw.push_back(*f);
      }
      auto rd = store_pass(s, **pool, blocks, qd, false, key_base);
      if (!rd.ok()) return fail(ctx, "kvtier read", rd.status());
      kr.push_back(*rd);
      if (fio) {
        auto f = fio_pass(fio_file, blocks * block, block, qd, false);
        if (!f.ok()) return fail(ctx, "fio read", f.status());
        fr.push_back(*f);
      }
    }
    const std::string io_kind(s.io_kind());
    const bool fixed = s.fixed_buffers_active();
    store->reset();
    ::unlink(store_file.c_str());
    ::unlink(fio_file.c_str());

    // Copy: emulated HBM <-> host pool vs memcpy. In range of uint32 (check_copy_size).
    const uint32_t pages = static_cast<uint32_t>(copy_pages(g));
    HbmTierConfig hb = ctx.config.tiers.hbm;
    hb.backend = HbmBackend::kEmulated;
    hb.capacity_bytes = uint64_t{pages} * FrameArena::frame_stride(g);
    hb.link_gbps = 0;
    auto hbm = HbmArena::create(hb, g, nullptr);
    if (!hbm.ok()) return fail(ctx, "HBM arena", hbm.status());
    // The host pool in the configured format: with tiers.host.kv_dtype fp8_e4m3 each copy
    // encodes or decodes, and the figure is the codec's rate in bytes of the model's pages.
    const PageFormat host_format = ctx.config.tiers.host_page_format(g);
    HostTierConfig hp = ctx.config.tiers.host;
    hp.capacity_bytes = hb.capacity_bytes;
    auto host = HostPool::create(hp, host_format, nullptr);
    if (!host.ok()) return fail(ctx, "host pool", host.status());
    // The arenas fall back to fewer frames when memory is short: measure what they hold.
    const uint32_t n = std::min({pages, (*hbm)->frame_count(), (*host)->frame_count()});
    if (n == 0) return fail(ctx, "copy", resource_exhausted("no frames in the arenas"));
    if (n < pages) {
      ctx.err << "kvtier-bench io: arenas smaller than asked; copying " << n << " of " << pages
              << " pages\n";
    }
    std::memset((*hbm)->base(), 1, (*hbm)->region_bytes());
    std::memset((*host)->base(), 2, (*host)->region_bytes());
    auto engine = TransferEngine::create(**hbm, **host, nullptr, {});
    if (!engine.ok()) return fail(ctx, "transfer engine", engine.status());
    std::vector<uint32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
    const std::size_t bytes = std::size_t{n} * g.page_bytes();
    std::vector<std::byte> a(bytes, std::byte{3}), b(bytes, std::byte{4});
    std::vector<double> kc, kd, kh, mc;
    for (uint64_t r = 0; r <= o_.runs; ++r) {  // the first round warms caches and is dropped
      auto d2h =
          engine_copy_pass(**engine, CopyDirection::kHbmToHost, n, g.layers, perm, g.page_bytes());
      if (!d2h.ok()) return fail(ctx, "copy hbm->host", d2h.status());
      auto h2d =
          engine_copy_pass(**engine, CopyDirection::kHostToHbm, n, g.layers, perm, g.page_bytes());
      if (!h2d.ok()) return fail(ctx, "copy host->hbm", h2d.status());
      const double t0 = now_s();
      std::memcpy(b.data(), a.data(), bytes);
      const double m = static_cast<double>(bytes) / kGiB / (now_s() - t0);
      if (r == 0) continue;
      kc.push_back((*d2h + *h2d) / 2);
      kd.push_back(*d2h);
      kh.push_back(*h2d);
      mc.push_back(m);
    }

    const std::optional<double> kwm = median(kw), krm = median(kr), kcm = median(kc),
                                kdm = median(kd), khm = median(kh), mcm = median(mc);
    const std::optional<double> fwm = fio ? std::optional<double>(median(fw)) : std::nullopt;
    const std::optional<double> frm = fio ? std::optional<double>(median(fr)) : std::nullopt;
    if (o_.json) {
      ctx.out << "{\"read\": {\"kvtier_mib_s\": " << json_number(krm)
              << ", \"fio_mib_s\": " << json_number(frm)
              << ", \"ratio\": " << json_number(ratio(krm, frm))
              << "}, \"write\": {\"kvtier_mib_s\": " << json_number(kwm)
              << ", \"fio_mib_s\": " << json_number(fwm)
              << ", \"ratio\": " << json_number(ratio(kwm, fwm))
              << "}, \"copy\": {\"kvtier_gib_s\": " << json_number(kcm)
              << ", \"hbm_to_host_gib_s\": " << json_number(kdm)
              << ", \"host_to_hbm_gib_s\": " << json_number(khm)
              << ", \"memcpy_gib_s\": " << json_number(mcm)
              << ", \"ratio\": " << json_number(ratio(kcm, mcm)) << "}, \"block_bytes\": " << block
              << ", \"queue_depth\": " << qd << ", \"file_bytes\": " << blocks * block
              << ", \"page_bytes\": " << g.page_bytes() << ", \"host_dtype\": \""
              << dtype_name(host_format.stored_dtype) << "\", \"runs\": " << o_.runs
              << ", \"io\": \"" << io_kind << (fixed ? "+fixed" : "") << "\"}\n";
      return kExitOk;
    }
    auto cell = [](std::optional<double> v) {
      std::ostringstream s;
      if (v) {
        s << std::fixed << std::setprecision(1) << *v;
      } else {
        s << "-";
      }
      return s.str();
    };
    auto rcell = [](std::optional<double> v) {
      std::ostringstream s;
      if (v) {
        s << std::fixed << std::setprecision(3) << *v;
      } else {
        s << "-";
      }
      return s.str();
    };
    ctx.out << "kvtier-bench io: block " << block << " bytes, queue depth " << qd << ", "
            << blocks * block / (1 << 20) << " MiB per pass, " << io_kind
            << (fixed ? " + fixed buffers" : "") << ", median of " << o_.runs << " runs\n\n"
            << std::left << std::setw(22) << "" << std::right << std::setw(14) << "kvtier"
            << std::setw(14) << "baseline" << std::setw(10) << "ratio"
            << "\n"
            << std::left << std::setw(22) << "nvme write (MiB/s)" << std::right << std::setw(14)
            << cell(kwm) << std::setw(14) << cell(fwm) << std::setw(10) << rcell(ratio(kwm, fwm))
            << "   baseline: fio\n"
            << std::left << std::setw(22) << "nvme read (MiB/s)" << std::right << std::setw(14)
            << cell(krm) << std::setw(14) << cell(frm) << std::setw(10) << rcell(ratio(krm, frm))
            << "   baseline: fio\n"
            << std::left << std::setw(22) << "copy (GiB/s)" << std::right << std::setw(14)
            << cell(kcm) << std::setw(14) << cell(mcm) << std::setw(10) << rcell(ratio(kcm, mcm))
            << "   baseline: memcpy; host pool (" << dtype_name(host_format.stored_dtype)
            << ") <-> emulated HBM, " << g.layers << " scattered pages per transfer\n"
            << std::left << std::setw(22) << "  hbm->host" << std::right << std::setw(14)
            << cell(kdm) << std::setw(14) << cell(mcm) << std::setw(10) << rcell(ratio(kdm, mcm))
            << "\n"
            << std::left << std::setw(22) << "  host->hbm" << std::right << std::setw(14)
            << cell(khm) << std::setw(14) << cell(mcm) << std::setw(10) << rcell(ratio(khm, mcm))
            << "\n";
    return kExitOk;
  }

  int run_gpu(const CommandContext& ctx) {
    const Geometry& g = ctx.config.model.geometry;
    auto device = open_cuda_device(ctx.config.tiers.hbm.device);
    if (!device.ok()) return fail(ctx, "--gpu", device.status());
    const uint32_t pages = static_cast<uint32_t>(copy_pages(g));  // in range: check_copy_size
    HbmTierConfig hb = ctx.config.tiers.hbm;
    hb.backend = HbmBackend::kCuda;
    hb.capacity_bytes = uint64_t{pages} * FrameArena::frame_stride(g);
    auto hbm = HbmArena::create(hb, g, *device);
    if (!hbm.ok()) return fail(ctx, "HBM arena", hbm.status());
    // As the CPU pass: the configured host format. The host region is at least the bytes of the
    // model's pages, which the baseline copies whole.
    const PageFormat host_format = ctx.config.tiers.host_page_format(g);
    HostTierConfig hp = ctx.config.tiers.host;
    hp.capacity_bytes = hb.capacity_bytes + FrameArena::frame_stride(host_format);
    auto host = HostPool::create(hp, host_format, *device);
    if (!host.ok()) return fail(ctx, "host pool", host.status());
    if ((*hbm)->frame_count() < pages || (*host)->frame_count() < pages) {
      ctx.err << "kvtier-bench io --gpu: arenas smaller than asked; measuring "
              << std::min((*hbm)->frame_count(), (*host)->frame_count()) << " pages\n";
    }
    const uint32_t n = std::min({pages, (*hbm)->frame_count(), (*host)->frame_count()});
    std::memset((*host)->base(), 5, (*host)->region_bytes());
    auto engine = TransferEngine::create(**hbm, **host, nullptr, {});
    if (!engine.ok()) return fail(ctx, "transfer engine", engine.status());
    auto stream = DeviceStream::create(*device);
    if (!stream.ok()) return fail(ctx, "stream", stream.status());
    std::vector<uint32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
    const std::size_t bytes = std::size_t{n} * g.page_bytes();
    // Baseline: one cudaMemcpyAsync of the same bytes between the same two arenas.
    auto plain = [&](CopyKind kind) -> Result<double> {
      CopySegment seg = kind == CopyKind::kHostToDevice
                            ? CopySegment{(*hbm)->base(), (*host)->base(), bytes}
                            : CopySegment{(*host)->base(), (*hbm)->base(), bytes};
      const double t0 = now_s();
      KVTIER_RETURN_IF_ERROR((*device)->copy_async({&seg, 1}, kind, stream->get()));
      KVTIER_RETURN_IF_ERROR((*device)->synchronize_stream(stream->get()));
      return static_cast<double>(bytes) / kGiB / (now_s() - t0);
    };
    std::vector<double> kh, kd, ch, cd;
    for (uint64_t r = 0; r <= o_.runs; ++r) {
      auto h2d =
          engine_copy_pass(**engine, CopyDirection::kHostToHbm, n, g.layers, perm, g.page_bytes());
      if (!h2d.ok()) return fail(ctx, "engine host->hbm", h2d.status());
      auto ph = plain(CopyKind::kHostToDevice);
      if (!ph.ok()) return fail(ctx, "cudaMemcpyAsync host->device", ph.status());
      auto d2h =
          engine_copy_pass(**engine, CopyDirection::kHbmToHost, n, g.layers, perm, g.page_bytes());
      if (!d2h.ok()) return fail(ctx, "engine hbm->host", d2h.status());
      auto pd = plain(CopyKind::kDeviceToHost);
      if (!pd.ok()) return fail(ctx, "cudaMemcpyAsync device->host", pd.status());
      if (r == 0) continue;  // warm-up
      kh.push_back(*h2d);
      ch.push_back(*ph);
      kd.push_back(*d2h);
      cd.push_back(*pd);
    }
    const double khm = median(kh), chm = median(ch), kdm = median(kd), cdm = median(cd);
    if (o_.json) {
      ctx.out << "{\"gpu\": {\"h2d\": {\"kvtier_gib_s\": " << json_number(khm)
              << ", \"cuda_gib_s\": " << json_number(chm)
              << ", \"ratio\": " << json_number(ratio(khm, chm))
              << "}, \"d2h\": {\"kvtier_gib_s\": " << json_number(kdm)
              << ", \"cuda_gib_s\": " << json_number(cdm)
              << ", \"ratio\": " << json_number(ratio(kdm, cdm))
              << "}}, \"page_bytes\": " << g.page_bytes() << ", \"host_dtype\": \""
              << dtype_name(host_format.stored_dtype) << "\", \"pages\": " << n
              << ", \"pages_per_transfer\": " << g.layers << ", \"runs\": " << o_.runs << "}\n";
      return kExitOk;
    }
    ctx.out << std::fixed << std::setprecision(2) << "kvtier-bench io --gpu: " << n << " pages of "
            << g.page_bytes() << " bytes, host pool in " << dtype_name(host_format.stored_dtype)
            << " (" << g.layers << " scattered pages per transfer), median of " << o_.runs
            << " runs\n"
            << "  host->hbm  kvtier " << khm << " GiB/s   cudaMemcpyAsync " << chm
            << " GiB/s   ratio " << std::setprecision(3) << ratio(khm, chm).value_or(0) << "\n"
            << std::setprecision(2) << "  hbm->host  kvtier " << kdm << " GiB/s   cudaMemcpyAsync "
            << cdm << " GiB/s   ratio " << std::setprecision(3) << ratio(kdm, cdm).value_or(0)
            << "\n";
    return kExitOk;
  }

  IoOptions o_;
};

}  // namespace

std::unique_ptr<Command> make_io_command() { return std::make_unique<IoCommand>(); }

}  // namespace kvtier::bench
