// NvmeStore: the extent files, their format and recovery, and the API engines call; the I/O
// threads are in nvme_worker.cpp. See nvme_store.hpp.
#include "tiers/nvme_store.hpp"

#include <fcntl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "kvtier/log.hpp"
#include "tiers/aligned_bytes.hpp"
#include "tiers/checksum.hpp"
#include "tiers/key_text.hpp"
#include "tiers/nvme_open_plan.hpp"
#include "tiers/nvme_worker.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

uint64_t random_store_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

// One page buffer per layer, none null, each aligned for O_DIRECT; `what` names the call.
template <typename Page>
Status check_page_buffers(const std::string& what, std::span<Page* const> pages, uint32_t layers,
                          uint32_t io_align) {
  if (pages.size() != layers) {
    return invalid_argument(what + ": " + std::to_string(pages.size()) +
                            " page buffers for a block of " + std::to_string(layers) + " layers");
  }
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] == nullptr || reinterpret_cast<uintptr_t>(pages[i]) % io_align != 0) {
      return invalid_argument(what + ": page buffer of layer " + std::to_string(i) +
                              " is null or not aligned to " + std::to_string(io_align) + " bytes");
    }
  }
  return Status();
}

}  // namespace

// --- NvmeStore -----------------------------------------------------------------------------------

NvmeStore::NvmeStore(const PageFormat& format, NvmeStoreOptions options)
    : format_(format),
      geometry_(format.stored_geometry()),
      options_(std::move(options)),
      stats_(options_.stats) {
  if (!stats_) stats_ = std::make_shared<TransferStats>();
  if (!options_.backend) options_.backend = posix_io_backend();
}

NvmeStore::~NvmeStore() {
  for (auto& w : workers_) w->stop();
  workers_.clear();
}

Result<std::unique_ptr<NvmeStore>> NvmeStore::create(const PageFormat& format,
                                                     NvmeStoreOptions options) {
  const NvmeTierConfig& c = options.config;
  if (c.paths.empty()) return invalid_argument("tiers.nvme.paths is empty");
  if (c.queue_depth == 0 || c.queue_depth > 4096) {
    return invalid_argument("tiers.nvme.queue_depth " + std::to_string(c.queue_depth) +
                            " is outside 1..4096");
  }
  if (c.io_threads == 0 || c.io_threads > 64) {
    return invalid_argument("tiers.nvme.io_threads " + std::to_string(c.io_threads) +
                            " is outside 1..64");
  }
  if (c.capacity_bytes == 0) return invalid_argument("tiers.nvme.capacity_bytes is 0");
  auto store = std::unique_ptr<NvmeStore>(new NvmeStore(format, std::move(options)));
  store->fingerprint_ = store_fingerprint(format);
  KVTIER_RETURN_IF_ERROR(store->open_files());
  KVTIER_RETURN_IF_ERROR(store->start_workers());
  KVTIER_RETURN_IF_ERROR(store->recover());
  return store;
}

Status NvmeStore::check_listed_once(const std::vector<OpenedFile>& opened, std::size_t index,
                                    const std::string& path, const FileInfo& info) {
  for (std::size_t j = 0; j < opened.size(); ++j) {
    if (j != index && opened[j].fd.valid() && same_file(opened[j].report.info, info)) {
      return invalid_argument(path_key(j) + " (" + opened[j].report.path + ") and " +
                              path_key(index) + " (" + path + ") are the same file; list each " +
                              "store file once");
    }
  }
  return Status();
}

std::string NvmeStore::path_key(std::size_t index) { return store_path_key(index); }

Result<ScopedFd> NvmeStore::open_store_path(const std::string& path, const std::string& key,
                                            bool create) {
  IoBackend& io = *options_.backend;
  if (create) {
    Status d = io.make_dirs(directory_of(path));
    if (!d.ok()) return d.with_context(key + " (" + path + ")");
  }
  const int base_flags = O_RDWR | (create ? O_CREAT : 0);
  auto fd = io.open(path, base_flags | (direct_io_ ? O_DIRECT : 0), 0600);
  if (!fd.ok() && direct_io_ && fd.status().code() == StatusCode::kInvalidArgument) {
    // Some filesystems (tmpfs) refuse O_DIRECT; the cache still works through the page cache.
    // The store then opens its other files buffered too (one direct_io_ for all of them).
    auto buffered = io.open(path, base_flags, 0600);
    if (buffered.ok() || buffered.status().code() == StatusCode::kNotFound) {
      log_once(
          LogLevel::kWarn, "nvme.odirect." + path,
          "O_DIRECT refused for " + path + " (" + fd.status().message() + "); using buffered I/O");
      direct_io_ = false;
      fd = std::move(buffered);
    }
  }
  return fd;
}

Result<NvmeStore::OpenedFile> NvmeStore::open_store_file(uint32_t index,
                                                         const std::vector<OpenedFile>& before) {
  OpenedFile o;
  const std::string& path = options_.config.paths[index];
  // Never created here: a file of an existing store is created only where its drive is mounted
  // (the plan says), and those of a new store once none is found to exist.
  Result<ScopedFd> fd = open_store_path(path, path_key(index), /*create=*/false);
  o.report = classify_store_path(*options_.backend, path, fd);
  if (fd.ok()) {
    // (An unstatted file's info identifies nothing.)
    KVTIER_RETURN_IF_ERROR(check_listed_once(before, index, path, o.report.info));
    o.fd = std::move(fd).value();
  }
  return o;
}

Superblock NvmeStore::superblock_of(uint32_t index, uint64_t extent_count,
                                    uint64_t first_offset) const {
  Superblock sb;
  sb.file_index = index;
  sb.file_count = static_cast<uint32_t>(options_.config.paths.size());
  sb.layout = layout_;
  sb.extent_count = extent_count;
  sb.first_offset = first_offset;
  sb.store_id = store_id_;
  sb.fingerprint = fingerprint_;
  sb.geometry = geometry_;
  return sb;
}

Status NvmeStore::write_superblock(int fd, const std::string& path, const Superblock& sb) {
  IoBackend& io = *options_.backend;
  auto buf = aligned_bytes(4096, kSuperblockBytes);
  if (!buf) return resource_exhausted("no memory for a superblock buffer");
  encode_superblock(sb, std::span<std::byte>(buf.get(), kSuperblockBytes));
  KVTIER_RETURN_IF_ERROR(io.write_at(fd, path, buf.get(), kSuperblockBytes, 0));
  return io.sync(fd, path);
}

Status NvmeStore::open_files() {
  const NvmeTierConfig& c = options_.config;
  direct_io_ = c.direct_io;
  std::vector<OpenedFile> opened;
  for (uint32_t i = 0; i < c.paths.size(); ++i) {
    KVTIER_ASSIGN_OR_RETURN(OpenedFile o, open_store_file(i, opened));
    opened.push_back(std::move(o));
  }
  std::vector<StoreFileReport> reports;
  for (const OpenedFile& o : opened) reports.push_back(o.report);
  const StoreOpenPlan plan = plan_store_open(reports, format_, direct_io_);
  KVTIER_RETURN_IF_ERROR(plan.refusal());
  const bool exists = plan.first.has_value();
  std::vector<uint32_t> per_file;
  uint64_t first_offset = 0;
  if (exists) {
    KVTIER_ASSIGN_OR_RETURN(per_file, adopt_existing_store(opened, plan));
    first_offset = plan.first->first_offset;
  } else {
    KVTIER_ASSIGN_OR_RETURN(per_file, format_new_store(opened, plan, first_offset));
  }
  scan_at_open_.assign(opened.size(), 0);
  for (std::size_t i = 0; i < opened.size(); ++i) {
    OpenedFile& o = opened[i];
    scan_at_open_[i] = exists && o.absent.empty() && !o.formatted_now ? 1 : 0;
    File f;
    f.path = o.report.path;
    f.fd = SharedFd(std::move(o.fd));
    f.extent_count = per_file[i];
    files_.push_back(std::move(f));
  }
  KVTIER_ASSIGN_OR_RETURN(extents_,
                          ExtentAllocator::create(per_file, layout_.extent_bytes, first_offset));
  readers_.assign(extents_->capacity(), 0);
  doomed_.assign(extents_->capacity(), 0);
  bad_.assign(extents_->capacity(), 0);
  file_health_ = NvmeFileHealth(static_cast<uint32_t>(files_.size()),
                                options_.config.out_of_service_after_failures,
                                std::chrono::milliseconds(options_.config.readmit_after_ms));
  unanswered_.assign(files_.size(), 0);
  for (std::size_t i = 0; i < opened.size(); ++i) {
    if (opened[i].absent.empty()) continue;
    const auto file = static_cast<uint32_t>(i);
    file_health_.take_out(file, NvmeFileHealth::Clock::now());
    extents_->retire_free_in_file(file);  // every one: nothing is allocated yet
  }
  stats_->files_out_of_service.store(file_health_.out_of_service(), std::memory_order_relaxed);
  return Status();
}

Result<std::vector<uint32_t>> NvmeStore::format_new_store(std::vector<OpenedFile>& opened,
                                                          const StoreOpenPlan& plan,
                                                          uint64_t& first_offset) {
  const NvmeTierConfig& c = options_.config;
  IoBackend& io = *options_.backend;
  for (uint32_t i = 0; i < opened.size(); ++i) {
    if (plan.files[i].fate != FileFate::kCreate) continue;
    KVTIER_ASSIGN_OR_RETURN(CreatedPath created, create_path(i));
    KVTIER_RETURN_IF_ERROR(take_created(opened, i, std::move(created)));
  }
  // An assumed block size (logical_block_known false) matters only to O_DIRECT.
  uint32_t io_align = 512;
  for (const OpenedFile& o : opened) {
    if (direct_io_ || o.report.info.logical_block_known) {
      io_align = std::max(io_align, o.report.info.logical_block);
    }
  }
  KVTIER_ASSIGN_OR_RETURN(layout_, ExtentLayout::make(format_, io_align));
  first_offset = std::max<uint64_t>(kSuperblockBytes, io_align);
  store_id_ = random_store_id();
  std::vector<uint32_t> per_file;
  for (uint32_t i = 0; i < opened.size(); ++i) {
    OpenedFile& o = opened[i];
    const FileInfo& info = o.report.info;
    const std::string& path = o.report.path;
    uint64_t count = c.capacity_bytes / opened.size() / layout_.extent_bytes;
    if (info.block_device) {
      log(LogLevel::kInfo, "formatting block device " + path + " as a kvtier store");
      count = std::min(count, extents_on_device(info.size, first_offset, layout_.extent_bytes));
    }
    count = std::min<uint64_t>(count, FrameAllocator::kMaxFrames / opened.size());
    if (count == 0) {
      return invalid_argument("tiers.nvme.capacity_bytes " + std::to_string(c.capacity_bytes) +
                              " leaves less than one extent (" +
                              std::to_string(layout_.extent_bytes) + " bytes) for " + path);
    }
    if (!info.block_device) {
      Status a = io.allocate(o.fd.get(), path, first_offset + count * layout_.extent_bytes);
      if (!a.ok()) return a.with_context(path_key(i));
    }
    KVTIER_RETURN_IF_ERROR(
        write_superblock(o.fd.get(), path, superblock_of(i, count, first_offset)));
    per_file.push_back(static_cast<uint32_t>(count));
  }
  return per_file;
}

Result<NvmeStore::CreatedPath> NvmeStore::create_path(uint32_t index) {
  const std::string& path = options_.config.paths[index];
  const std::string key = path_key(index);
  CreatedPath created;
  KVTIER_ASSIGN_OR_RETURN(created.fd, open_store_path(path, key, /*create=*/true));
  Result<FileInfo> info = options_.backend->stat(created.fd.get(), path);
  if (!info.ok()) return std::move(info).status().with_context(key);
  created.info = *info;
  return created;
}

Status NvmeStore::take_created(std::vector<OpenedFile>& opened, uint32_t index,
                               CreatedPath created) {
  OpenedFile& o = opened[index];
  // Two paths naming one missing file (a/b and a//b) would both create it.
  KVTIER_RETURN_IF_ERROR(check_listed_once(opened, index, o.report.path, created.info));
  o.fd = std::move(created.fd);
  o.report.info = created.info;
  o.report.holds = StoreFileReport::Holds::kBlank;
  return Status();
}

Result<std::vector<uint32_t>> NvmeStore::adopt_existing_store(std::vector<OpenedFile>& opened,
                                                              const StoreOpenPlan& plan) {
  const NvmeTierConfig& c = options_.config;
  const Superblock& first = *plan.first;
  store_id_ = first.store_id;
  layout_ = plan.layout;
  KVTIER_RETURN_IF_ERROR(replace_lost_files(opened, plan));
  std::vector<uint32_t> per_file;
  uint64_t total = 0;
  bool differs = false;
  for (uint32_t i = 0; i < opened.size(); ++i) {
    const OpenedFile& o = opened[i];
    if (!o.absent.empty()) {
      // Out of service from the start, with as many extents as the store's first file (files
      // are made equal unless a block device was smaller); a probe checks that count.
      log(LogLevel::kError, "NVMe store: " + o.absent +
                                "; the store opens without it, out of service" +
                                (c.readmit_after_ms == 0
                                     ? std::string(" until a restart")
                                     : ", and probes it in " + std::to_string(c.readmit_after_ms) +
                                           " ms (tiers.nvme.readmit_after_ms)"));
      per_file.push_back(static_cast<uint32_t>(first.extent_count));
      continue;
    }
    const uint64_t extents = o.report.superblock->extent_count;  // used or formatted now
    per_file.push_back(static_cast<uint32_t>(extents));
    total += extents * layout_.extent_bytes;
    differs |= extents != c.capacity_bytes / opened.size() / layout_.extent_bytes;
  }
  if (differs) {
    const std::string& path = opened[0].report.path;
    log_once(LogLevel::kInfo, "nvme.capacity." + path,
             "NVMe store " + path + " keeps its existing size (" + std::to_string(total) +
                 " bytes of extents); tiers.nvme.capacity_bytes " +
                 std::to_string(c.capacity_bytes) + " applies to new stores");
  }
  return per_file;
}

Status NvmeStore::start_workers() {
  const NvmeTierConfig& c = options_.config;
  QueueOptions q;
  q.depth = c.queue_depth * static_cast<uint32_t>(kMaxFixedRuns);
  q.sqpoll = c.sqpoll;
  for (uint32_t i = 0; i < c.io_threads; ++i) {
    KVTIER_ASSIGN_OR_RETURN(auto queue, options_.backend->make_queue(q));
    auto worker = std::make_unique<Worker>(*this, std::move(queue), c.queue_depth,
                                           std::chrono::milliseconds(c.io_timeout_ms));
    KVTIER_RETURN_IF_ERROR(worker->start(options_.fixed_buffers, options_.use_fixed_buffers));
    workers_.push_back(std::move(worker));
  }
  return Status();
}

void NvmeStore::post(std::unique_ptr<Op> op) {
  const uint64_t n = next_worker_.fetch_add(1, std::memory_order_relaxed);
  workers_[n % workers_.size()]->post(std::move(op));
}

Result<ExtentLocation> NvmeStore::place(uint32_t extent) const { return extents_->locate(extent); }

Status NvmeStore::recover() {
  // Files just formatted have every extent free: nothing to scan there.
  if (std::none_of(scan_at_open_.begin(), scan_at_open_.end(), [](uint8_t s) { return s; })) {
    return Status();
  }
  const uint32_t capacity = extents_->capacity();
  ScanBatch batch;
  batch.headers.resize(capacity);
  batch.codes.assign(capacity, StatusCode::kOk);
  // Only files that held this store's superblock are read (not those opened without, out of
  // service from the start, nor those formatted now).
  std::vector<ExtentLocation> places;
  std::vector<uint32_t> scanned;
  for (uint32_t e = 0; e < capacity; ++e) {
    KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(e));
    if (scan_at_open_[loc.file] == 0) continue;
    places.push_back(loc);
    scanned.push_back(e);
  }
  batch.remaining = scanned.size();
  for (std::size_t i = 0; i < scanned.size(); ++i) {
    const uint32_t e = scanned[i];
    const ExtentLocation& loc = places[i];
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kScan;
    op->extent = e;
    op->file = loc.file;
    op->fd = files_[loc.file].fd;
    op->extent_offset = loc.offset;
    op->scan = &batch;
    post(std::move(op));
  }
  {
    std::unique_lock<std::mutex> lock(batch.mu);
    batch.cv.wait(lock, [&] { return batch.remaining == 0; });
  }
  struct Best {
    uint32_t extent;
    uint64_t generation;
  };
  std::unordered_map<BlockKey, Best, BlockKeyHash> best;
  uint64_t dropped = 0;
  uint64_t io_failures = 0;
  uint64_t max_generation = 0;
  for (uint32_t e = 0; e < capacity; ++e) {
    const auto& h = batch.headers[e];
    if (!h.has_value()) {
      if (batch.codes[e] == StatusCode::kDataLoss) ++dropped;
      if (batch.codes[e] == StatusCode::kIoError ||
          batch.codes[e] == StatusCode::kDeadlineExceeded) {
        ++io_failures;
      }
      continue;
    }
    if (h->fingerprint != fingerprint_ || h->store_id != store_id_ || h->layers != layout_.layers ||
        h->page_bytes != layout_.page_bytes || h->key.is_null()) {
      ++dropped;
      continue;
    }
    max_generation = std::max(max_generation, h->generation);
    auto [it, inserted] = best.try_emplace(h->key, Best{e, h->generation});
    if (!inserted) {
      ++dropped;  // an older copy of the same block (a rewrite after an erase or a crash)
      if (h->generation > it->second.generation) it->second = Best{e, h->generation};
    }
  }
  std::vector<uint32_t> keep;
  keep.reserve(best.size());
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    for (const auto& [key, b] : best) {
      const ExtentHeader& h = *batch.headers[b.extent];
      Entry entry;
      entry.extent = b.extent;
      entry.generation = b.generation;
      entry.state = EntryState::kReady;
      entry.checksum_kind = h.checksum_kind;
      entry.page_sums = h.page_sums;
      index_.emplace(key, std::move(entry));
      keep.push_back(b.extent);
    }
    next_generation_ = max_generation + 1;
  }
  KVTIER_RETURN_IF_ERROR(extents_->reserve_all(keep));
  stats_->recovered_blocks.fetch_add(keep.size(), std::memory_order_relaxed);
  stats_->dropped_extents.fetch_add(dropped, std::memory_order_relaxed);
  log(LogLevel::kInfo,
      "NVMe store " + files_[0].path + ": recovered " + std::to_string(keep.size()) +
          " blocks of " + std::to_string(capacity) + " extents" +
          (dropped > 0
               ? "; dropped " + std::to_string(dropped) + " torn, foreign or superseded extents"
               : std::string()) +
          (io_failures > 0 ? "; " + std::to_string(io_failures) + " extent headers unreadable"
                           : std::string()));
  return Status();
}

Result<Transfer> NvmeStore::write_block(const BlockKey& key,
                                        std::span<const std::byte* const> pages,
                                        TransferOptions options) {
  const std::string what = "write_block " + key_text(key);
  KVTIER_RETURN_IF_ERROR(check_page_buffers(what, pages, layout_.layers, layout_.io_align));
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kWrite;
  op->key = key;
  op->checksum_kind = options_.config.checksum;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    post_due_probes_locked();
    auto it = index_.find(key);
    if (it != index_.end() && it->second.state == EntryState::kReady) {
      return already_exists(what + ": the block is already in the NVMe store");
    }
    if (it != index_.end()) {
      // Being written: join that write (equal keys mean equal bytes, and it carries them). An
      // erase waiting for it is undone, since this caller wants the block; if the write fails,
      // this caller is told so (see the header).
      it->second.erase_when_written = false;
      auto joined = std::make_shared<TransferState>(Link::kHostToNvme, format_.block_bytes(),
                                                    std::move(options), nullptr, options_.notifier);
      it->second.joined.push_back(joined);
      return Transfer(std::move(joined));
    }
    auto extent = extents_->allocate();
    if (!extent.ok()) {
      return resource_exhausted(what + ": NVMe store full (all " +
                                std::to_string(extents_->capacity()) + " extents in use)");
    }
    auto loc = place(*extent);
    if (!loc.ok()) {
      extents_->free(*extent).ignore();
      return std::move(loc).status();
    }
    if (Status hung = refuse_on_a_hung_drive_locked(loc->file, what); !hung.ok()) {
      free_extent_locked(*extent);
      return hung;
    }
    op->extent = *extent;
    op->file = loc->file;
    op->fd = files_[loc->file].fd;
    op->extent_offset = loc->offset;
    op->generation = next_generation_++;
    Entry e;
    e.extent = op->extent;
    e.generation = op->generation;
    e.checksum_kind = op->checksum_kind;
    index_.emplace(key, std::move(e));
  }
  // Checksums on the caller's thread: spreads the CPU over submitters, off the I/O thread.
  op->page_sums.resize(layout_.layers);
  op->pages.resize(layout_.layers);
  for (uint32_t i = 0; i < layout_.layers; ++i) {
    op->page_sums[i] = checksum(op->checksum_kind, pages[i], layout_.page_bytes);
    op->pages[i] = const_cast<std::byte*>(pages[i]);  // iovec wants non-const; never written
  }
  op->state = std::make_shared<TransferState>(Link::kHostToNvme, format_.block_bytes(),
                                              std::move(options), stats_, options_.notifier);
  Transfer t(op->state);
  post(std::move(op));
  return t;
}

Result<Transfer> NvmeStore::read_block(const BlockKey& key, std::span<std::byte* const> pages,
                                       TransferOptions options) {
  const std::string what = "read_block " + key_text(key);
  KVTIER_RETURN_IF_ERROR(check_page_buffers(what, pages, layout_.layers, layout_.io_align));
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kReadBlock;
  op->key = key;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    KVTIER_RETURN_IF_ERROR(claim_for_read(key, what, *op).status());
  }
  op->pages.assign(pages.begin(), pages.end());
  op->state = std::make_shared<TransferState>(Link::kNvmeToHost, format_.block_bytes(),
                                              std::move(options), stats_, options_.notifier);
  Transfer t(op->state);
  post(std::move(op));
  return t;
}

Result<const NvmeStore::Entry*> NvmeStore::claim_for_read(const BlockKey& key,
                                                          const std::string& what, Op& op) {
  auto it = index_.find(key);
  if (it == index_.end()) return not_found(what + ": the block is not in the NVMe store");
  if (it->second.state != EntryState::kReady) {
    return failed_precondition(what + ": the block is still being written");
  }
  KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(it->second.extent));
  KVTIER_RETURN_IF_ERROR(refuse_on_a_hung_drive_locked(loc.file, what));
  op.extent = it->second.extent;
  op.file = loc.file;
  op.fd = files_[loc.file].fd;
  op.extent_offset = loc.offset;
  op.generation = it->second.generation;
  ++readers_[op.extent];
  return &it->second;
}

Result<Transfer> NvmeStore::read_page(const BlockKey& key, uint32_t layer, std::byte* page,
                                      TransferOptions options) {
  const std::string what = "read_page " + key_text(key) + " layer " + std::to_string(layer);
  if (layer >= layout_.layers) {
    return out_of_range(what + ": the block has " + std::to_string(layout_.layers) + " layers");
  }
  if (page == nullptr || reinterpret_cast<uintptr_t>(page) % layout_.io_align != 0) {
    return invalid_argument(what + ": buffer is null or not aligned to " +
                            std::to_string(layout_.io_align) + " bytes");
  }
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kReadPage;
  op->key = key;
  op->layer = layer;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    KVTIER_ASSIGN_OR_RETURN(const Entry* entry, claim_for_read(key, what, *op));
    op->checksum_kind = entry->checksum_kind;
    op->page_sums = {entry->page_sums[layer]};
  }
  op->pages = {page};
  op->state = std::make_shared<TransferState>(Link::kNvmeToHost, format_.page_bytes(),
                                              std::move(options), stats_, options_.notifier);
  Transfer t(op->state);
  post(std::move(op));
  return t;
}

Status NvmeStore::erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(index_mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return not_found("erase " + key_text(key) + ": the block is not in the NVMe store");
  }
  if (it->second.state == EntryState::kWriting) {
    it->second.erase_when_written = true;
    return Status();
  }
  const uint32_t extent = it->second.extent;
  index_.erase(it);
  if (readers_[extent] == 0) {
    free_extent_locked(extent);
  } else {
    doomed_[extent] = 1;
  }
  return Status();
}

bool NvmeStore::contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(index_mu_);
  auto it = index_.find(key);
  return it != index_.end() && it->second.state == EntryState::kReady;
}

std::vector<BlockKey> NvmeStore::keys() const {
  std::lock_guard<std::mutex> lock(index_mu_);
  std::vector<BlockKey> out;
  out.reserve(index_.size());
  for (const auto& [key, e] : index_) {
    if (e.state == EntryState::kReady) out.push_back(key);
  }
  return out;
}

Result<ExtentPlace> NvmeStore::locate(const BlockKey& key) const {
  uint32_t extent;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return not_found("block " + key_text(key) + " is not in the store");
    extent = it->second.extent;
  }
  KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(extent));
  return ExtentPlace{files_[loc.file].path, loc.offset, extent};
}

std::string_view NvmeStore::io_kind() const { return workers_.front()->kind(); }
bool NvmeStore::fixed_buffers_active() const { return workers_.front()->fixed_active(); }

Status NvmeStore::audit() const {
  std::lock_guard<std::mutex> lock(index_mu_);
  KVTIER_RETURN_IF_ERROR(extents_->audit());
  std::vector<uint8_t> seen(extents_->capacity(), 0);
  for (const auto& [key, e] : index_) {
    if (!extents_->is_allocated(e.extent)) {
      return internal_error("block " + key_text(key) + " maps to free extent " +
                            std::to_string(e.extent));
    }
    if (seen[e.extent]++ != 0) {
      return internal_error("extent " + std::to_string(e.extent) + " is mapped twice");
    }
  }
  uint64_t draining = 0;
  for (uint32_t x = 0; x < extents_->capacity(); ++x) {
    if (doomed_[x] != 0) {
      if (seen[x] != 0 || !extents_->is_allocated(x)) {
        return internal_error("dropped extent " + std::to_string(x) + " is inconsistent");
      }
      ++draining;
    }
  }
  if (index_.size() + draining != extents_->used()) {
    return internal_error("NVMe store accounting: " + std::to_string(index_.size()) + " blocks + " +
                          std::to_string(draining) + " draining extents != " +
                          std::to_string(extents_->used()) + " extents in use");
  }
  return Status();
}

std::vector<std::shared_ptr<TransferState>> NvmeStore::write_finished(const Op& op, bool ok) {
  std::lock_guard<std::mutex> lock(index_mu_);
  auto it = index_.find(op.key);
  if (it == index_.end() || it->second.generation != op.generation) {
    // Cannot happen: a writing entry is only removed here. Keep the accounting right anyway.
    log(LogLevel::kError, "NVMe store: write of " + key_text(op.key) + " lost its index entry");
    free_extent_locked(op.extent);
    return {};
  }
  std::vector<std::shared_ptr<TransferState>> joined = std::move(it->second.joined);
  it->second.joined.clear();
  if (ok) file_health_.on_ok(op.file);
  const bool file_in_service = file_health_.in_service(op.file);
  if (ok && !it->second.erase_when_written && file_in_service) {
    it->second.state = EntryState::kReady;
    it->second.page_sums = op.page_sums;
    return joined;
  }
  // Written to a file taken out of service meanwhile: the block is lost with the file's others.
  if (ok && !it->second.erase_when_written) {
    lost_.push_back(op.key);
    has_lost_.store(true, std::memory_order_release);
  }
  if (!ok && is_media_error(op.io_errno)) {
    note_media_error_locked(op.extent, op.file,
                            "write of " + key_text(op.key) + " failed with a media error (" +
                                errno_text(op.io_errno) + ")");
  }
  index_.erase(it);
  free_extent_locked(op.extent);
  return joined;
}

void NvmeStore::complete_joined(std::vector<std::shared_ptr<TransferState>>& joined,
                                const BlockKey& key, const Status& result) {
  for (auto& state : joined) {
    if (result.ok()) {
      state->complete(Status());
      continue;
    }
    Status s(result.code(), "write_block " + key_text(key) + " joined the write of that block " +
                                "already in flight, which did not complete: " + result.message());
    state->complete(s);
    s.ignore();
  }
  joined.clear();
}

void NvmeStore::read_finished(const Op& op, bool ok) {
  std::lock_guard<std::mutex> lock(index_mu_);
  if (ok) file_health_.on_ok(op.file);
  if (--readers_[op.extent] == 0 && doomed_[op.extent] != 0) free_extent_locked(op.extent);
}

void NvmeStore::drop_corrupt(const Op& op, const std::string& why) {
  stats_->checksum_failures.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(op.key);
    if (it != index_.end() && it->second.generation == op.generation) {
      index_.erase(it);
      doomed_[op.extent] = 1;
    }
  }
  log(LogLevel::kWarn, "NVMe store: " + why + "; the block is dropped");
}

}  // namespace kvtier
