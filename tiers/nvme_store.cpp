#include "tiers/nvme_store.hpp"

#include <fcntl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include "kvtier/log.hpp"
#include "tiers/aligned_bytes.hpp"
#include "tiers/checksum.hpp"
#include "tiers/key_text.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

// A contiguous run in memory that maps to a contiguous range on disk may use a registered buffer;
// past this many runs one vectored request is cheaper than several fixed ones.
constexpr std::size_t kMaxFixedRuns = 4;
constexpr std::size_t kMaxIov = 1024;                    // IOV_MAX
constexpr uint64_t kMaxFixedBuffer = uint64_t{1} << 30;  // io_uring's limit per registered buffer

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return {};
  return path.substr(0, slash);
}

// Both describe one file or one block device (reached through two paths).
bool same_file(const FileInfo& a, const FileInfo& b) {
  return a.identified && b.identified && a.block_device == b.block_device && a.device == b.device &&
         a.inode == b.inode;
}

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

// --- Operations ----------------------------------------------------------------------------------

struct ScanBatch {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t remaining = 0;
  // Per extent: the decoded header, or the reason there is none.
  std::vector<std::optional<ExtentHeader>> headers;
  std::vector<StatusCode> codes;
};

struct Segment {
  NvmeStore::Op* op = nullptr;
  IoOpcode opcode = IoOpcode::kRead;
  uint64_t offset = 0;  // advances past completed bytes
  std::vector<iovec> iov;
  std::size_t iov_first = 0;  // first iovec with bytes left
  uint64_t remaining = 0;
  int buffer_index = -1;
};

struct NvmeStore::Op {
  enum class Kind : uint8_t { kWrite, kReadBlock, kReadPage, kScan };
  Kind kind = Kind::kReadBlock;
  std::shared_ptr<TransferState> state;  // null for scans
  BlockKey key;
  uint32_t extent = 0;
  uint32_t file = 0;
  uint64_t extent_offset = 0;
  uint64_t generation = 0;
  uint32_t layer = 0;
  ChecksumKind checksum_kind = ChecksumKind::kXxh3;
  std::vector<uint64_t> page_sums;  // write: computed; read_page: the expected one
  std::vector<std::byte*> pages;
  ScanBatch* scan = nullptr;

  // Owned by the I/O thread from here on.
  int slot = -1;
  std::byte* header = nullptr;
  std::vector<Segment> segments;
  std::size_t outstanding = 0;
  StatusCode error_code = StatusCode::kOk;
  std::string error_message;

  void fail(const Status& s) {
    if (error_code == StatusCode::kOk) {
      error_code = s.code();
      error_message = s.message();
    } else {
      s.ignore();
    }
  }
  Status error() const {
    return error_code == StatusCode::kOk ? Status() : Status(error_code, error_message);
  }
};

// --- Worker: one I/O thread, one queue --------------------------------------------------------

class NvmeStore::Worker {
 public:
  Worker(NvmeStore& store, std::unique_ptr<IoQueue> queue, uint32_t max_ops)
      : store_(store), queue_(std::move(queue)), max_ops_(max_ops), active_(max_ops) {}

  ~Worker() { stop(); }

  Status start(const std::vector<iovec>& fixed_buffers, bool use_fixed) {
    const std::size_t header_bytes = store_.layout_.header_bytes;
    slab_ = aligned_bytes(std::max<std::size_t>(4096, store_.layout_.io_align),
                          header_bytes * max_ops_);
    if (!slab_) return resource_exhausted("NVMe store: no memory for the header buffers");
    for (uint32_t i = max_ops_; i > 0; --i) free_slots_.push_back(static_cast<int>(i - 1));
    if (use_fixed && queue_->kind() != "sync") {
      for (const iovec& b : fixed_buffers) {
        auto* base = static_cast<std::byte*>(b.iov_base);
        for (uint64_t off = 0; off < b.iov_len; off += kMaxFixedBuffer) {
          regions_.push_back(iovec{
              base + off, static_cast<std::size_t>(std::min(kMaxFixedBuffer, b.iov_len - off))});
        }
      }
      regions_.push_back(iovec{slab_.get(), header_bytes * max_ops_});
      Status r = queue_->register_buffers(regions_);
      if (r.ok()) {
        registered_ = true;
      } else {
        log_once(LogLevel::kInfo, "nvme.fixed_buffers",
                 "io_uring fixed buffers refused (" + r.message() + "); using plain requests");
        regions_.clear();
      }
    }
    thread_ = std::thread([this] { run(); });
    return Status();
  }

  void post(std::unique_ptr<Op> op) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        inbox_.push_back(std::move(op));
        wake = sleeping_;
      }
    }
    if (op) {  // stopping: never queued
      cancel(std::move(op));
      return;
    }
    if (wake) queue_->wake();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
    }
    queue_->wake();
    if (thread_.joinable()) thread_.join();
  }

  std::string_view kind() const { return queue_->kind(); }
  bool fixed_active() const { return registered_; }

 private:
  void run() {
    std::vector<IoCompletion> done;
    while (true) {
      std::vector<std::unique_ptr<Op>> incoming;
      bool stop;
      {
        std::lock_guard<std::mutex> lock(mu_);
        incoming.swap(inbox_);
        stop = stopping_;
      }
      for (auto& op : incoming) backlog_.push_back(std::move(op));
      if (stop) {
        while (!backlog_.empty()) {
          cancel(std::move(backlog_.front()));
          backlog_.pop_front();
        }
      }
      admit();
      submit_ready();
      if (stop && active_count_ == 0) break;

      int timeout = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (inbox_.empty() && stopping_ == stop) {
          sleeping_ = true;
          timeout = -1;
        }
      }
      // The queue took nothing and nothing is in flight: retry shortly rather than sleep forever.
      if (!ready_.empty() && in_flight_ == 0) timeout = 1;
      done.clear();
      Status w = queue_->wait(done, timeout);
      {
        std::lock_guard<std::mutex> lock(mu_);
        sleeping_ = false;
      }
      if (!w.ok()) {
        log_once(LogLevel::kError, "nvme.wait", "NVMe I/O thread: " + w.to_string());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      for (const IoCompletion& c : done) {
        --in_flight_;
        on_completion(reinterpret_cast<Segment*>(c.tag), c.result);
      }
    }
  }

  void admit() {
    while (!backlog_.empty() && !free_slots_.empty()) {
      std::unique_ptr<Op> op = std::move(backlog_.front());
      backlog_.pop_front();
      if (op->state && op->state->cancel_requested()) {
        cancel(std::move(op));
        continue;
      }
      const int slot = free_slots_.back();
      free_slots_.pop_back();
      op->slot = slot;
      op->header = slab_.get() + std::size_t{store_.layout_.header_bytes} * slot;
      prepare(*op);
      ++active_count_;
      active_[slot] = std::move(op);
    }
  }

  int fixed_index(const std::byte* p, uint64_t len) const {
    for (std::size_t i = 0; i < regions_.size(); ++i) {
      const auto* base = static_cast<const std::byte*>(regions_[i].iov_base);
      if (p >= base && p + len <= base + regions_[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

  struct Piece {
    std::byte* mem;
    uint64_t len;
    uint64_t disk;
  };

  void prepare(Op& op) {
    const ExtentLayout& l = store_.layout_;
    std::vector<Piece> pieces;
    IoOpcode opcode = IoOpcode::kRead;
    switch (op.kind) {
      case Op::Kind::kWrite: {
        opcode = IoOpcode::kWrite;
        ExtentHeader h;
        h.key = op.key;
        h.fingerprint = store_.fingerprint_;
        h.generation = op.generation;
        h.store_id = store_.store_id_;
        h.layers = l.layers;
        h.checksum_kind = op.checksum_kind;
        h.page_bytes = static_cast<uint32_t>(l.page_bytes);
        h.page_sums = op.page_sums;
        encode_extent_header(h, std::span<std::byte>(op.header, l.header_bytes));
        [[fallthrough]];
      }
      case Op::Kind::kReadBlock:
        pieces.push_back({op.header, l.header_bytes, op.extent_offset});
        for (uint32_t i = 0; i < l.layers; ++i) {
          pieces.push_back({op.pages[i], l.page_stride, op.extent_offset + l.page_offset(i)});
        }
        break;
      case Op::Kind::kReadPage:
        pieces.push_back({op.pages[0], l.page_stride, op.extent_offset + l.page_offset(op.layer)});
        break;
      case Op::Kind::kScan: pieces.push_back({op.header, l.header_bytes, op.extent_offset}); break;
    }
    // Coalesce neighbours that are adjacent in memory (they always are on disk).
    std::vector<Piece> runs;
    for (const Piece& p : pieces) {
      if (!runs.empty() && runs.back().mem + runs.back().len == p.mem &&
          runs.back().disk + runs.back().len == p.disk) {
        runs.back().len += p.len;
      } else {
        runs.push_back(p);
      }
    }
    bool fixed = registered_ && runs.size() <= kMaxFixedRuns;
    std::vector<int> indices;
    if (fixed) {
      for (const Piece& r : runs) {
        const int idx = fixed_index(r.mem, r.len);
        if (idx < 0) {
          fixed = false;
          break;
        }
        indices.push_back(idx);
      }
    }
    op.segments.clear();
    if (fixed) {
      op.segments.resize(runs.size());
      for (std::size_t i = 0; i < runs.size(); ++i) {
        Segment& s = op.segments[i];
        s.op = &op;
        s.opcode = opcode;
        s.offset = runs[i].disk;
        s.iov = {iovec{runs[i].mem, runs[i].len}};
        s.remaining = runs[i].len;
        s.buffer_index = indices[i];
      }
    } else {
      const std::size_t count = (runs.size() + kMaxIov - 1) / kMaxIov;
      op.segments.resize(count);
      for (std::size_t k = 0; k < count; ++k) {
        Segment& s = op.segments[k];
        s.op = &op;
        s.opcode = opcode;
        const std::size_t first = k * kMaxIov;
        const std::size_t last = std::min(runs.size(), first + kMaxIov);
        s.offset = runs[first].disk;
        for (std::size_t i = first; i < last; ++i) {
          s.iov.push_back(iovec{runs[i].mem, runs[i].len});
          s.remaining += runs[i].len;
        }
      }
    }
    op.outstanding = op.segments.size();
    for (Segment& s : op.segments) ready_.push_back(&s);
  }

  void submit_ready() {
    while (!ready_.empty()) {
      requests_.clear();
      for (std::size_t i = 0; i < ready_.size() && i < 64; ++i) {
        Segment* s = ready_[i];
        const Op& op = *s->op;
        IoRequest r;
        r.tag = reinterpret_cast<uint64_t>(s);
        r.opcode = s->opcode;
        r.fd = store_.files_[op.file].fd.get();
        r.offset = s->offset;
        r.iov = s->iov.data() + s->iov_first;
        r.iovcnt = static_cast<uint32_t>(s->iov.size() - s->iov_first);
        r.buffer_index = r.iovcnt == 1 ? s->buffer_index : -1;
        requests_.push_back(r);
      }
      auto accepted = queue_->submit(requests_);
      const std::size_t n = accepted.ok() ? *accepted : 0;
      if (!accepted.ok()) {
        log_once(LogLevel::kError, "nvme.submit", "NVMe submit: " + accepted.status().to_string());
      }
      in_flight_ += static_cast<uint32_t>(n);
      for (std::size_t i = 0; i < n; ++i) ready_.pop_front();
      if (n < requests_.size()) {
        store_.stats_->sq_full_waits.fetch_add(1, std::memory_order_relaxed);
        break;  // the rest waits, in order, for completions to free slots
      }
    }
  }

  std::string describe(const Segment& s) const {
    const Op& op = *s.op;
    return std::string(s.opcode == IoOpcode::kRead ? "read " : "write ") +
           store_.files_[op.file].path + " at offset " + std::to_string(s.offset) + " (" +
           std::to_string(s.remaining) + " bytes left)";
  }

  void on_completion(Segment* s, int32_t res) {
    Op& op = *s->op;
    TransferStats& stats = *store_.stats_;
    bool finished = true;
    if (res < 0) {
      const int err = -res;
      if (err == EAGAIN || err == EINTR) {
        stats.io_requeued.fetch_add(1, std::memory_order_relaxed);
        ready_.push_back(s);
        finished = false;
      } else {
        stats.io_errors.fetch_add(1, std::memory_order_relaxed);
        op.fail(errno_status(io_errno_code(err), describe(*s), err));
      }
    } else if (res == 0 && s->remaining > 0) {
      stats.io_errors.fetch_add(1, std::memory_order_relaxed);
      op.fail(s->opcode == IoOpcode::kRead
                  ? io_error(describe(*s) + ": unexpected end of file")
                  : resource_exhausted(describe(*s) + ": no progress (device full?)"));
    } else if (static_cast<uint64_t>(res) < s->remaining) {
      // Short transfer: advance past what was done and queue the rest.
      uint64_t n = static_cast<uint64_t>(res);
      s->offset += n;
      s->remaining -= n;
      while (n > 0) {
        iovec& v = s->iov[s->iov_first];
        if (n >= v.iov_len) {
          n -= v.iov_len;
          ++s->iov_first;
        } else {
          v.iov_base = static_cast<std::byte*>(v.iov_base) + n;
          v.iov_len -= n;
          n = 0;
        }
      }
      stats.io_requeued.fetch_add(1, std::memory_order_relaxed);
      ready_.push_back(s);
      finished = false;
    } else {
      s->remaining = 0;
    }
    if (finished && --op.outstanding == 0) finish(op);
  }

  Status verify_block(const Op& op) const {
    const ExtentLayout& l = store_.layout_;
    auto h = decode_extent_header(std::span<const std::byte>(op.header, l.header_bytes));
    if (!h.ok()) return data_loss(h.status().message());
    if (h->key != op.key) return data_loss("header names block " + key_text(h->key));
    if (h->generation != op.generation || h->fingerprint != store_.fingerprint_ ||
        h->store_id != store_.store_id_ || h->layers != l.layers || h->page_bytes != l.page_bytes) {
      return data_loss("header generation/geometry/store id do not match the index");
    }
    for (uint32_t i = 0; i < l.layers; ++i) {
      const uint64_t sum = checksum(h->checksum_kind, op.pages[i], l.page_bytes);
      if (sum != h->page_sums[i]) {
        return data_loss("page of layer " + std::to_string(i) + " fails its checksum (stored " +
                         hex64(h->page_sums[i]) + ", computed " + hex64(sum) + ")");
      }
    }
    return Status();
  }

  Status verify_page(const Op& op) const {
    const uint64_t sum = checksum(op.checksum_kind, op.pages[0], store_.layout_.page_bytes);
    if (sum != op.page_sums[0]) {
      return data_loss("page of layer " + std::to_string(op.layer) +
                       " fails its checksum (stored " + hex64(op.page_sums[0]) + ", computed " +
                       hex64(sum) + ")");
    }
    return Status();
  }

  std::string block_context(const Op& op, const char* what) const {
    return std::string(what) + " block " + key_text(op.key) + " (" + store_.files_[op.file].path +
           ", extent at offset " + std::to_string(op.extent_offset) + ")";
  }

  void finish(Op& op) {
    Status result = op.error();
    std::vector<std::shared_ptr<TransferState>> joined;
    const BlockKey key = op.key;
    switch (op.kind) {
      case Op::Kind::kWrite:
        joined = store_.write_finished(op, result.ok());
        if (!result.ok()) result = result.with_context(block_context(op, "write"));
        break;
      case Op::Kind::kReadBlock:
      case Op::Kind::kReadPage:
        if (result.ok()) {
          result = op.kind == Op::Kind::kReadBlock ? verify_block(op) : verify_page(op);
          if (!result.ok()) {
            result = result.with_context(block_context(op, "read"));
            store_.drop_corrupt(op, result.message());
            result = data_loss(result.message() + "; the block is dropped");
          }
        } else {
          result = result.with_context(block_context(op, "read"));
        }
        store_.read_finished(op);
        break;
      case Op::Kind::kScan: {
        ScanBatch& b = *op.scan;
        std::optional<ExtentHeader> header;
        StatusCode code = result.code();
        if (result.ok()) {
          auto h = decode_extent_header(
              std::span<const std::byte>(op.header, store_.layout_.header_bytes));
          code = h.status().code();
          if (h.ok()) header = std::move(h).value();
        }
        std::lock_guard<std::mutex> lock(b.mu);
        b.headers[op.extent] = std::move(header);
        b.codes[op.extent] = code;
        if (--b.remaining == 0) b.cv.notify_all();
        break;
      }
    }
    const int slot = op.slot;
    std::shared_ptr<TransferState> state = std::move(op.state);
    free_slots_.push_back(slot);
    --active_count_;
    active_[slot].reset();  // `op` is gone from here on
    if (state) state->complete(result);
    NvmeStore::complete_joined(joined, key, result);
    result.ignore();
  }

  // Completes an operation that never reached the kernel.
  void cancel(std::unique_ptr<Op> op) {
    const Status why =
        cancelled("transfer cancelled before its I/O started (block " + key_text(op->key) + ")");
    std::vector<std::shared_ptr<TransferState>> joined;
    switch (op->kind) {
      case Op::Kind::kWrite: joined = store_.write_finished(*op, false); break;
      case Op::Kind::kReadBlock:
      case Op::Kind::kReadPage: store_.read_finished(*op); break;
      case Op::Kind::kScan: {
        ScanBatch& b = *op->scan;
        std::lock_guard<std::mutex> lock(b.mu);
        b.codes[op->extent] = StatusCode::kCancelled;
        if (--b.remaining == 0) b.cv.notify_all();
        break;
      }
    }
    if (op->state) op->state->complete(why);
    NvmeStore::complete_joined(joined, op->key, why);
    why.ignore();
  }

  NvmeStore& store_;
  std::unique_ptr<IoQueue> queue_;
  const uint32_t max_ops_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Op>> inbox_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool sleeping_ = false;                   // guarded by mu_
  std::thread thread_;

  // I/O thread only.
  std::deque<std::unique_ptr<Op>> backlog_;
  std::vector<std::unique_ptr<Op>> active_;  // by header slot
  std::size_t active_count_ = 0;
  std::deque<Segment*> ready_;
  std::vector<IoRequest> requests_;
  uint32_t in_flight_ = 0;
  AlignedBytes slab_;
  std::vector<int> free_slots_;
  std::vector<iovec> regions_;  // registered buffers, in registration order
  bool registered_ = false;
};

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

Status NvmeStore::open_files() {
  const NvmeTierConfig& c = options_.config;
  IoBackend& io = *options_.backend;
  struct Opened {
    std::string path;
    ScopedFd fd;
    FileInfo info;
    std::optional<Superblock> sb;
  };
  std::vector<Opened> opened;
  direct_io_ = c.direct_io;
  for (std::size_t i = 0; i < c.paths.size(); ++i) {
    const std::string& path = c.paths[i];
    const std::string key = "tiers.nvme.paths[" + std::to_string(i) + "]";
    const std::string dir = parent_dir(path);
    if (!dir.empty()) {
      Status d = io.make_dirs(dir);
      if (!d.ok()) return d.with_context(key + " (" + path + ")");
    }
    const int base_flags = O_RDWR | O_CREAT;
    auto fd = io.open(path, base_flags | (c.direct_io ? O_DIRECT : 0), 0600);
    if (!fd.ok() && c.direct_io && fd.status().code() == StatusCode::kInvalidArgument) {
      // Some filesystems (tmpfs) refuse O_DIRECT; the cache still works through the page cache.
      auto buffered = io.open(path, base_flags, 0600);
      if (buffered.ok()) {
        log_once(LogLevel::kWarn, "nvme.odirect." + path,
                 "O_DIRECT refused for " + path + " (" + fd.status().message() +
                     "); using buffered I/O");
        direct_io_ = false;
        fd = std::move(buffered);
      }
    }
    if (!fd.ok()) return std::move(fd).status().with_context(key);
    auto info = io.stat(fd->get(), path);
    if (!info.ok()) return std::move(info).status().with_context(key);
    // Checked before anything is read or formatted: the same file twice would hand out each of its
    // offsets to two extents, and both copies would look empty and be formatted over each other.
    for (std::size_t j = 0; j < opened.size(); ++j) {
      if (same_file(opened[j].info, *info)) {
        return invalid_argument("tiers.nvme.paths[" + std::to_string(j) + "] (" + opened[j].path +
                                ") and [" + std::to_string(i) + "] (" + path +
                                ") are the same file; list each store file once");
      }
    }
    Opened o{path, std::move(fd).value(), *info, std::nullopt};
    if (o.info.size > 0 || o.info.block_device) {
      auto buf = aligned_bytes(4096, kSuperblockBytes);
      if (!buf) return resource_exhausted("no memory for a superblock buffer");
      Status r = o.info.size < kSuperblockBytes
                     ? not_found(path + " is too small for a superblock")
                     : io.read_at(o.fd.get(), path, buf.get(), kSuperblockBytes, 0);
      if (!r.ok() && r.code() != StatusCode::kNotFound) return r.with_context(key);
      auto sb =
          r.ok() ? decode_superblock(std::span<const std::byte>(buf.get(), kSuperblockBytes), path)
                 : Result<Superblock>(std::move(r));
      if (sb.ok()) {
        o.sb = *sb;
      } else if (sb.status().code() == StatusCode::kNotFound && o.info.block_device) {
        log(LogLevel::kInfo, "formatting block device " + path + " as a kvtier store");
      } else if (sb.status().code() == StatusCode::kNotFound) {
        return failed_precondition(key + ": " + path + " is not empty (" +
                                   std::to_string(o.info.size) +
                                   " bytes) and is not a kvtier store; refusing to overwrite it");
      } else {
        return std::move(sb).status().with_context(key);
      }
    }
    opened.push_back(std::move(o));
  }

  std::size_t existing = 0;
  for (const Opened& o : opened) existing += o.sb.has_value() ? 1 : 0;
  if (existing != 0 && existing != opened.size()) {
    return failed_precondition(
        "tiers.nvme.paths mixes existing store files with new ones (" + std::to_string(existing) +
        " of " + std::to_string(opened.size()) +
        " exist); remove them all or list the store's files exactly as before");
  }

  std::vector<uint32_t> per_file;
  if (existing == 0) {
    // An assumed block size (logical_block_known false) matters only to O_DIRECT.
    uint32_t io_align = 512;
    for (const Opened& o : opened) {
      if (direct_io_ || o.info.logical_block_known) {
        io_align = std::max(io_align, o.info.logical_block);
      }
    }
    KVTIER_ASSIGN_OR_RETURN(layout_, ExtentLayout::make(format_, io_align));
    const uint64_t first = std::max<uint64_t>(kSuperblockBytes, io_align);
    store_id_ = random_store_id();
    auto sb_buf = aligned_bytes(4096, kSuperblockBytes);
    if (!sb_buf) return resource_exhausted("no memory for a superblock buffer");
    for (std::size_t i = 0; i < opened.size(); ++i) {
      Opened& o = opened[i];
      uint64_t count = c.capacity_bytes / opened.size() / layout_.extent_bytes;
      if (o.info.block_device) {
        count =
            std::min(count, o.info.size > first ? (o.info.size - first) / layout_.extent_bytes : 0);
      }
      count = std::min<uint64_t>(count, FrameAllocator::kMaxFrames / opened.size());
      if (count == 0) {
        return invalid_argument("tiers.nvme.capacity_bytes " + std::to_string(c.capacity_bytes) +
                                " leaves less than one extent (" +
                                std::to_string(layout_.extent_bytes) + " bytes) for " + o.path);
      }
      if (!o.info.block_device) {
        Status a =
            options_.backend->allocate(o.fd.get(), o.path, first + count * layout_.extent_bytes);
        if (!a.ok()) return a.with_context("tiers.nvme.paths[" + std::to_string(i) + "]");
      }
      Superblock sb;
      sb.file_index = static_cast<uint32_t>(i);
      sb.file_count = static_cast<uint32_t>(opened.size());
      sb.layout = layout_;
      sb.extent_count = count;
      sb.first_offset = first;
      sb.store_id = store_id_;
      sb.fingerprint = fingerprint_;
      sb.geometry = geometry_;
      encode_superblock(sb, std::span<std::byte>(sb_buf.get(), kSuperblockBytes));
      KVTIER_RETURN_IF_ERROR(io.write_at(o.fd.get(), o.path, sb_buf.get(), kSuperblockBytes, 0));
      KVTIER_RETURN_IF_ERROR(io.sync(o.fd.get(), o.path));
      per_file.push_back(static_cast<uint32_t>(count));
    }
  } else {
    const Superblock& first = *opened[0].sb;
    store_id_ = first.store_id;
    for (std::size_t i = 0; i < opened.size(); ++i) {
      const Opened& o = opened[i];
      const Superblock& sb = *o.sb;
      if (sb.fingerprint != fingerprint_ || !(sb.geometry == geometry_)) {
        return failed_precondition(
            o.path + " holds a kvtier store for geometry " + describe_geometry(sb.geometry) +
            (sb.fingerprint != fingerprint_ && sb.geometry == geometry_
                 ? std::string(format_.encodes() ? " without" : " with") + " per-page fp8 scales"
                 : std::string()) +
            " but the configured geometry is " + describe_page_format(format_) +
            "; point tiers.nvme.paths elsewhere or remove the file");
      }
      if (sb.store_id != store_id_ || sb.file_count != opened.size() || sb.file_index != i) {
        return failed_precondition(o.path + " is file " + std::to_string(sb.file_index) + " of " +
                                   std::to_string(sb.file_count) + " of store " +
                                   hex64(sb.store_id) + ", but is listed as tiers.nvme.paths[" +
                                   std::to_string(i) + "] of " + std::to_string(opened.size()) +
                                   " (store " + hex64(store_id_) + ")");
      }
      KVTIER_ASSIGN_OR_RETURN(ExtentLayout expect, ExtentLayout::make(format_, sb.layout.io_align));
      if (expect.header_bytes != sb.layout.header_bytes ||
          expect.page_stride != sb.layout.page_stride ||
          expect.extent_bytes != sb.layout.extent_bytes || sb.first_offset != first.first_offset ||
          sb.layout.io_align != first.layout.io_align) {
        return data_loss("superblock of " + o.path + " describes an inconsistent extent layout");
      }
      // Only a reported block size refuses a store: with an assumed one, a store written at a
      // finer alignment is used as it is (its I/O would fail, each one reported, were it wrong).
      if (direct_io_ && o.info.logical_block_known &&
          sb.layout.io_align % o.info.logical_block != 0) {
        return failed_precondition(
            o.path + " was written with " + std::to_string(sb.layout.io_align) +
            "-byte alignment; its device needs " + std::to_string(o.info.logical_block));
      }
      const uint64_t needed = sb.first_offset + sb.extent_count * sb.layout.extent_bytes;
      if (o.info.size < needed) {
        return data_loss(o.path + " is truncated: " + std::to_string(o.info.size) +
                         " bytes, its superblock describes " + std::to_string(needed));
      }
      per_file.push_back(static_cast<uint32_t>(sb.extent_count));
    }
    KVTIER_ASSIGN_OR_RETURN(layout_, ExtentLayout::make(format_, first.layout.io_align));
    needs_scan_ = true;
    uint64_t total = 0;
    bool differs = false;
    for (uint32_t n : per_file) {
      total += n * layout_.extent_bytes;
      differs |= n != c.capacity_bytes / opened.size() / layout_.extent_bytes;
    }
    if (differs) {
      log_once(LogLevel::kInfo, "nvme.capacity." + opened[0].path,
               "NVMe store " + opened[0].path + " keeps its existing size (" +
                   std::to_string(total) + " bytes of extents); tiers.nvme.capacity_bytes " +
                   std::to_string(c.capacity_bytes) + " applies to new stores");
    }
  }
  for (Opened& o : opened) {
    File f;
    f.path = o.path;
    f.fd = std::move(o.fd);
    files_.push_back(std::move(f));
  }
  for (std::size_t i = 0; i < per_file.size(); ++i) files_[i].extent_count = per_file[i];
  const uint64_t first_offset = existing == 0
                                    ? std::max<uint64_t>(kSuperblockBytes, layout_.io_align)
                                    : opened[0].sb->first_offset;
  KVTIER_ASSIGN_OR_RETURN(extents_,
                          ExtentAllocator::create(per_file, layout_.extent_bytes, first_offset));
  readers_.assign(extents_->capacity(), 0);
  doomed_.assign(extents_->capacity(), 0);
  return Status();
}

Status NvmeStore::start_workers() {
  const NvmeTierConfig& c = options_.config;
  QueueOptions q;
  q.depth = c.queue_depth * static_cast<uint32_t>(kMaxFixedRuns);
  q.sqpoll = c.sqpoll;
  for (uint32_t i = 0; i < c.io_threads; ++i) {
    KVTIER_ASSIGN_OR_RETURN(auto queue, options_.backend->make_queue(q));
    auto worker = std::make_unique<Worker>(*this, std::move(queue), c.queue_depth);
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
  // A fresh store was just formatted: every extent is free, nothing to scan.
  if (!needs_scan_) return Status();
  const uint32_t capacity = extents_->capacity();
  ScanBatch batch;
  batch.remaining = capacity;
  batch.headers.resize(capacity);
  batch.codes.assign(capacity, StatusCode::kOk);
  for (uint32_t e = 0; e < capacity; ++e) {
    KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(e));
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kScan;
    op->extent = e;
    op->file = loc.file;
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
      if (batch.codes[e] == StatusCode::kIoError) ++io_failures;
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
    op->extent = *extent;
    op->file = loc->file;
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
    auto it = index_.find(key);
    if (it == index_.end()) return not_found(what + ": the block is not in the NVMe store");
    if (it->second.state != EntryState::kReady) {
      return failed_precondition(what + ": the block is still being written");
    }
    KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(it->second.extent));
    op->extent = it->second.extent;
    op->file = loc.file;
    op->extent_offset = loc.offset;
    op->generation = it->second.generation;
    ++readers_[op->extent];
  }
  op->pages.assign(pages.begin(), pages.end());
  op->state = std::make_shared<TransferState>(Link::kNvmeToHost, format_.block_bytes(),
                                              std::move(options), stats_, options_.notifier);
  Transfer t(op->state);
  post(std::move(op));
  return t;
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
    auto it = index_.find(key);
    if (it == index_.end()) return not_found(what + ": the block is not in the NVMe store");
    if (it->second.state != EntryState::kReady) {
      return failed_precondition(what + ": the block is still being written");
    }
    KVTIER_ASSIGN_OR_RETURN(ExtentLocation loc, place(it->second.extent));
    op->extent = it->second.extent;
    op->file = loc.file;
    op->extent_offset = loc.offset;
    op->generation = it->second.generation;
    op->checksum_kind = it->second.checksum_kind;
    op->page_sums = {it->second.page_sums[layer]};
    ++readers_[op->extent];
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

void NvmeStore::free_extent_locked(uint32_t extent) {
  doomed_[extent] = 0;
  Status s = extents_->free(extent);
  if (!s.ok()) log(LogLevel::kError, "NVMe store: " + s.to_string());
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
  if (ok && !it->second.erase_when_written) {
    it->second.state = EntryState::kReady;
    it->second.page_sums = op.page_sums;
    return joined;
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

void NvmeStore::read_finished(const Op& op) {
  std::lock_guard<std::mutex> lock(index_mu_);
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
