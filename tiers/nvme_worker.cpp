// NvmeStore::Worker: one I/O thread and its queue. See nvme_worker.hpp.
#include "tiers/nvme_worker.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "kvtier/log.hpp"
#include "tiers/aligned_bytes.hpp"
#include "tiers/checksum.hpp"
#include "tiers/key_text.hpp"
#include "tiers/sys_error.hpp"

namespace kvtier {

Status NvmeStore::Worker::start(const std::vector<iovec>& fixed_buffers, bool use_fixed) {
  const std::size_t header_bytes = store_.layout_.header_bytes;
  // One file (drive) may hold every slot; of several, none more than half, so that a drive that
  // stops answering cannot take the slots the others need before its requests time out.
  const auto files = static_cast<uint32_t>(store_.files_.size());
  slots_per_file_ = files > 1 ? std::max<uint32_t>(1, max_ops_ / 2) : max_ops_;
  active_in_file_.assign(files, 0);
  slab_ =
      aligned_bytes(std::max<std::size_t>(4096, store_.layout_.io_align), header_bytes * max_ops_);
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

void NvmeStore::Worker::post(std::unique_ptr<Op> op) {
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

void NvmeStore::Worker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  queue_->wake();
  if (thread_.joinable()) thread_.join();
}

void NvmeStore::Worker::run() {
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
    timeout = ms_to_next_timeout(timeout);
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
    handle(done);
    find_unanswered();
  }
}

void NvmeStore::Worker::handle(const std::vector<IoCompletion>& done) {
  for (const IoCompletion& c : done) {
    --in_flight_;
    on_completion(reinterpret_cast<Segment*>(c.tag), c.result);
  }
}

int NvmeStore::Worker::ms_to_next_timeout(int timeout_ms) const {
  if (io_timeout_.count() == 0 || in_flight_ == 0) return timeout_ms;
  const auto left = next_timeout_ - std::chrono::steady_clock::now();
  const int64_t ms =
      std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(left).count());
  if (timeout_ms >= 0 && timeout_ms < ms) return timeout_ms;
  return static_cast<int>(std::min<int64_t>(ms, io_timeout_.count()));
}

void NvmeStore::Worker::find_unanswered() {
  if (io_timeout_.count() == 0 || std::chrono::steady_clock::now() < next_timeout_) return;
  // Answers that arrived since the wait returned (this thread may have been descheduled for a
  // while) are answers, not timeouts.
  std::vector<IoCompletion> arrived;
  if (queue_->wait(arrived, 0).ok()) handle(arrived);
  const auto now = std::chrono::steady_clock::now();
  next_timeout_ = std::chrono::steady_clock::time_point::max();
  for (const std::unique_ptr<Op>& op : active_) {
    if (!op) continue;
    for (Segment& seg : op->segments) {
      if (!seg.in_flight || seg.unanswered) continue;
      const auto due = seg.submitted_at + io_timeout_;
      if (due <= now) {
        on_unanswered(seg);
      } else {
        next_timeout_ = std::min(next_timeout_, due);
      }
    }
  }
}

void NvmeStore::Worker::on_unanswered(Segment& s) {
  Op& op = *s.op;
  s.unanswered = true;
  const std::string what = describe(s) + " unanswered after " +
                           std::to_string(io_timeout_.count()) + " ms (tiers.nvme.io_timeout_ms)";
  store_.note_unanswered(op, what);
  if (op.abandoned) return;
  switch (op.kind) {
    case Op::Kind::kWrite: {
      op.abandoned = true;
      std::vector<std::shared_ptr<TransferState>> joined = store_.abandon_write(op);
      Status result = store_.failed_on_a_dead_drive(
          op, deadline_exceeded(block_context(op, "write") + ": " + what +
                                "; abandoned, its extent stays reserved until the drive answers"));
      if (op.state) {
        op.state->hold_buffers();  // the drive may still read them: released in finish()
        op.state->complete(result);
      }
      NvmeStore::complete_joined(joined, op.key, result);
      result.ignore();
      break;
    }
    case Op::Kind::kScan: {
      op.abandoned = true;
      ScanBatch& b = *op.scan;
      std::lock_guard<std::mutex> lock(b.mu);
      b.codes[op.extent] = StatusCode::kDeadlineExceeded;
      if (--b.remaining == 0) b.cv.notify_all();
      break;
    }
    case Op::Kind::kProbe:
      op.abandoned = true;
      store_.probe_finished(op, deadline_exceeded("probe: " + what));
      break;
    case Op::Kind::kReadBlock:
    case Op::Kind::kReadPage: {
      // The caller's memory: the read ends when the drive answers, unless the caller takes its
      // buffers back then (on_buffers_released) and so need not wait for a hung drive.
      if (!op.state || !op.state->may_hold_buffers()) break;
      op.abandoned = true;
      Status result = store_.failed_on_a_dead_drive(
          op, deadline_exceeded(block_context(op, "read") + ": " + what +
                                "; abandoned, its buffers stay the drive's until it answers"));
      op.state->hold_buffers();
      op.state->complete(result);
      result.ignore();
      break;
    }
  }
}

void NvmeStore::Worker::admit() {
  // In order, except that an operation whose file holds its share of the slots waits for one of
  // them while those behind it, for other files, go ahead.
  for (auto it = backlog_.begin(); it != backlog_.end() && !free_slots_.empty();) {
    if ((*it)->state && (*it)->state->cancel_requested()) {
      cancel(std::move(*it));
      it = backlog_.erase(it);
      continue;
    }
    if (Status hung = store_.refuse_on_a_hung_drive(**it); !hung.ok()) {
      cancel(std::move(*it), hung);
      it = backlog_.erase(it);
      continue;
    }
    const uint32_t file = (*it)->file;
    if (active_in_file_[file] >= slots_per_file_) {
      ++it;
      continue;
    }
    std::unique_ptr<Op> op = std::move(*it);
    it = backlog_.erase(it);
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    op->slot = slot;
    op->header = slab_.get() + std::size_t{store_.layout_.header_bytes} * slot;
    prepare(*op);
    ++active_count_;
    ++active_in_file_[file];
    active_[slot] = std::move(op);
  }
}

int NvmeStore::Worker::fixed_index(const std::byte* p, uint64_t len) const {
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const auto* base = static_cast<const std::byte*>(regions_[i].iov_base);
    if (p >= base && p + len <= base + regions_[i].iov_len) return static_cast<int>(i);
  }
  return -1;
}

void NvmeStore::Worker::prepare(Op& op) {
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
    case Op::Kind::kProbe:
      if (op.probe_writes) opcode = IoOpcode::kWrite;
      pieces.push_back({op.probe_buffer.get(), op.probe_bytes, 0});
      break;
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

void NvmeStore::Worker::submit_ready() {
  while (!ready_.empty()) {
    requests_.clear();
    for (std::size_t i = 0; i < ready_.size() && i < 64; ++i) {
      Segment* s = ready_[i];
      const Op& op = *s->op;
      IoRequest r;
      r.tag = reinterpret_cast<uint64_t>(s);
      r.opcode = s->opcode;
      r.fd = op.fd.get();
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
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      Segment* seg = ready_.front();
      ready_.pop_front();
      seg->in_flight = true;
      seg->submitted_at = now;
    }
    if (n > 0 && io_timeout_.count() > 0) {
      next_timeout_ = std::min(next_timeout_, now + io_timeout_);
    }
    if (n < requests_.size()) {
      store_.stats_->sq_full_waits.fetch_add(1, std::memory_order_relaxed);
      break;  // the rest waits, in order, for completions to free slots
    }
  }
}

std::string NvmeStore::Worker::describe(const Segment& s) const {
  const Op& op = *s.op;
  return std::string(s.opcode == IoOpcode::kRead ? "read " : "write ") +
         store_.files_[op.file].path + " at offset " + std::to_string(s.offset) + " (" +
         std::to_string(s.remaining) + " bytes left)";
}

void NvmeStore::Worker::on_completion(Segment* s, int32_t res) {
  Op& op = *s->op;
  TransferStats& stats = *store_.stats_;
  s->in_flight = false;
  if (s->unanswered) {
    s->unanswered = false;
    store_.note_answered(op);
  }
  bool finished = true;
  if (res < 0) {
    const int err = -res;
    if (err == EAGAIN || err == EINTR) {
      stats.io_requeued.fetch_add(1, std::memory_order_relaxed);
      ready_.push_back(s);
      finished = false;
    } else {
      stats.io_errors.fetch_add(1, std::memory_order_relaxed);
      op.fail(errno_status(io_errno_code(err), describe(*s), err), err);
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

Status NvmeStore::Worker::verify_block(const Op& op) const {
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

Status NvmeStore::Worker::verify_page(const Op& op) const {
  const uint64_t sum = checksum(op.checksum_kind, op.pages[0], store_.layout_.page_bytes);
  if (sum != op.page_sums[0]) {
    return data_loss("page of layer " + std::to_string(op.layer) + " fails its checksum (stored " +
                     hex64(op.page_sums[0]) + ", computed " + hex64(sum) + ")");
  }
  return Status();
}

std::string NvmeStore::Worker::block_context(const Op& op, const char* what) const {
  return std::string(what) + " block " + key_text(op.key) + " (" + store_.files_[op.file].path +
         ", extent at offset " + std::to_string(op.extent_offset) + ")";
}

void NvmeStore::Worker::finish(Op& op) {
  Status result = op.error();
  std::vector<std::shared_ptr<TransferState>> joined;
  const BlockKey key = op.key;
  if (op.abandoned) {
    // Its caller was told when it was abandoned; only what it held is let go now.
    if (op.kind == Op::Kind::kWrite) store_.abandoned_write_ended(op, result.ok());
    if (op.kind == Op::Kind::kReadBlock || op.kind == Op::Kind::kReadPage) {
      store_.read_finished(op, result.ok());  // what it read is dropped unverified
    }
    std::shared_ptr<TransferState> state = std::move(op.state);
    result.ignore();
    release(op);  // `op` is gone from here on
    if (state) state->release_buffers();
    return;
  }
  switch (op.kind) {
    case Op::Kind::kWrite:
      joined = store_.write_finished(op, result.ok());
      if (!result.ok()) {
        result = store_.failed_on_a_dead_drive(op, result.with_context(block_context(op, "write")));
      }
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
        if (is_media_error(op.io_errno)) store_.blame_extent(op, result.message());
        result = store_.failed_on_a_dead_drive(op, result);
      }
      store_.read_finished(op, result.ok());
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
    case Op::Kind::kProbe: store_.probe_answered(op, result); break;
  }
  std::shared_ptr<TransferState> state = std::move(op.state);
  release(op);  // `op` is gone from here on
  if (state) state->complete(result);
  NvmeStore::complete_joined(joined, key, result);
  result.ignore();
}

void NvmeStore::Worker::release(Op& op) {
  const int slot = op.slot;
  free_slots_.push_back(slot);
  --active_count_;
  --active_in_file_[op.file];
  active_[slot].reset();
}

void NvmeStore::Worker::cancel(std::unique_ptr<Op> op) {
  const Status why =
      cancelled("transfer cancelled before its I/O started (block " + key_text(op->key) + ")");
  cancel(std::move(op), why);
  why.ignore();
}

void NvmeStore::Worker::cancel(std::unique_ptr<Op> op, const Status& why) {
  std::vector<std::shared_ptr<TransferState>> joined;
  switch (op->kind) {
    case Op::Kind::kWrite: joined = store_.write_finished(*op, false); break;
    case Op::Kind::kReadBlock:
    case Op::Kind::kReadPage: store_.read_finished(*op, false); break;
    case Op::Kind::kScan: {
      ScanBatch& b = *op->scan;
      std::lock_guard<std::mutex> lock(b.mu);
      b.codes[op->extent] = why.code();
      if (--b.remaining == 0) b.cv.notify_all();
      break;
    }
    case Op::Kind::kProbe: store_.probe_finished(*op, why); break;
  }
  if (op->state) op->state->complete(why);
  NvmeStore::complete_joined(joined, op->key, why);
}

}  // namespace kvtier
