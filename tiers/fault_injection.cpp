#include "tiers/fault_injection.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

#include "tiers/sys_error.hpp"

namespace kvtier {
namespace {

// Flips one byte of the file behind `fd` at `offset` through a second, buffered descriptor.
Status flip_via_fd(int fd, uint64_t offset) {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  return FaultInjectingIoBackend::flip_byte_on_disk(proc, offset);
}

class FaultQueue final : public IoQueue {
 public:
  FaultQueue(FaultInjectingIoBackend& backend, std::unique_ptr<IoQueue> inner)
      : backend_(backend), inner_(std::move(inner)) {}

  std::string_view kind() const override { return inner_->kind(); }
  uint32_t depth() const override { return inner_->depth(); }
  Status register_buffers(std::span<const iovec> buffers) override {
    return inner_->register_buffers(buffers);
  }
  void wake() noexcept override { inner_->wake(); }

  Result<std::size_t> submit(std::span<const IoRequest> requests) override {
    std::size_t accepted = 0;
    for (const IoRequest& r : requests) {
      if (in_flight_ >= inner_->depth()) break;
      const auto d = backend_.decide(r);
      if (d.fire && d.rule.kind == FaultKind::kHang) {
        held_.push_back(r);
        backend_.fired();
        ++accepted;
        ++in_flight_;
        continue;
      }
      if (d.fire && (d.rule.kind == FaultKind::kError || d.rule.kind == FaultKind::kAgain)) {
        synthetic_.push_back(
            IoCompletion{r.tag, d.rule.kind == FaultKind::kError ? -d.rule.error : -EAGAIN});
        backend_.fired();
        ++accepted;
        ++in_flight_;
        continue;
      }
      IoRequest forward = r;
      Tracked t;
      if (d.fire && d.rule.kind == FaultKind::kShort) {
        uint64_t total = 0;
        for (uint32_t i = 0; i < r.iovcnt; ++i) total += r.iov[i].iov_len;
        uint64_t keep = std::max<uint64_t>(512, total / 2 / 512 * 512);
        if (keep < total) {
          for (uint32_t i = 0; i < r.iovcnt && keep > 0; ++i) {
            const uint64_t n = std::min<uint64_t>(keep, r.iov[i].iov_len);
            t.iov.push_back(iovec{r.iov[i].iov_base, static_cast<std::size_t>(n)});
            keep -= n;
          }
        }
      }
      if (d.fire && d.rule.kind == FaultKind::kCorrupt) {
        t.corrupt = true;
        t.corrupt_at = d.rule.corrupt_at;
      }
      if (!t.iov.empty()) {
        auto it = tracked_.insert_or_assign(r.tag, std::move(t)).first;
        forward.iov = it->second.iov.data();
        forward.iovcnt = static_cast<uint32_t>(it->second.iov.size());
      } else if (t.corrupt) {
        tracked_.insert_or_assign(r.tag, std::move(t));
      }
      auto n = inner_->submit(std::span<const IoRequest>(&forward, 1));
      if (!n.ok() || *n == 0) {
        backend_.undo(r.opcode);
        tracked_.erase(r.tag);
        if (!n.ok()) return n;
        break;
      }
      if (d.fire) backend_.fired();
      originals_[r.tag] = r;
      ++accepted;
      ++in_flight_;
    }
    return accepted;
  }

  Status wait(std::vector<IoCompletion>& out, int timeout_ms) override {
    const std::size_t before = out.size();
    KVTIER_RETURN_IF_ERROR(answer_held());
    if (!held_.empty() && (timeout_ms < 0 || timeout_ms > kHeldPollMs)) timeout_ms = kHeldPollMs;
    if (!synthetic_.empty()) {
      out.insert(out.end(), synthetic_.begin(), synthetic_.end());
      in_flight_ -= static_cast<uint32_t>(synthetic_.size());
      synthetic_.clear();
      timeout_ms = 0;  // also collect whatever is ready, without blocking
    }
    const std::size_t real_from = out.size();
    KVTIER_RETURN_IF_ERROR(inner_->wait(out, timeout_ms));
    for (std::size_t i = real_from; i < out.size(); ++i) {
      --in_flight_;
      const IoCompletion& c = out[i];
      auto orig = originals_.find(c.tag);
      auto t = tracked_.find(c.tag);
      if (t != tracked_.end()) {
        if (t->second.corrupt && c.result > 0 && orig != originals_.end() &&
            t->second.corrupt_at < static_cast<uint64_t>(c.result)) {
          corrupt(orig->second, t->second.corrupt_at);
        }
        tracked_.erase(t);
      }
      if (orig != originals_.end()) originals_.erase(orig);
    }
    (void)before;
    return Status();
  }

 private:
  struct Tracked {
    std::vector<iovec> iov;  // the shortened list, when shortened
    bool corrupt = false;
    uint64_t corrupt_at = 0;
  };

  static constexpr int kHeldPollMs = 5;

  // Once the drive answers: held requests go to the kernel, or fail with its error.
  Status answer_held() {
    if (held_.empty() || backend_.answers() == answers_seen_) return Status();
    answers_seen_ = backend_.answers();
    const int error = backend_.answer_error();
    std::vector<IoRequest> held;
    held.swap(held_);
    for (const IoRequest& r : held) {
      if (error != 0) {
        synthetic_.push_back(IoCompletion{r.tag, -error});
        continue;
      }
      auto n = inner_->submit(std::span<const IoRequest>(&r, 1));
      if (!n.ok()) return std::move(n).status();
      if (*n == 0) return internal_error("fault injection: the queue refused a held request");
      originals_[r.tag] = r;
    }
    return Status();
  }

  static void corrupt(const IoRequest& r, uint64_t at) {
    if (r.opcode == IoOpcode::kWrite) {
      flip_via_fd(r.fd, r.offset + at).ignore();
      return;
    }
    for (uint32_t i = 0; i < r.iovcnt; ++i) {
      if (at < r.iov[i].iov_len) {
        static_cast<unsigned char*>(r.iov[i].iov_base)[at] ^= 0xFF;
        return;
      }
      at -= r.iov[i].iov_len;
    }
  }

  FaultInjectingIoBackend& backend_;
  std::unique_ptr<IoQueue> inner_;
  uint32_t in_flight_ = 0;
  std::vector<IoCompletion> synthetic_;
  std::vector<IoRequest> held_;  // hung, in flight as far as the caller knows
  uint64_t answers_seen_ = 0;
  std::unordered_map<uint64_t, Tracked> tracked_;
  std::unordered_map<uint64_t, IoRequest> originals_;
};

}  // namespace

FaultInjectingIoBackend::FaultInjectingIoBackend(std::shared_ptr<IoBackend> inner)
    : inner_(std::move(inner)) {}

void FaultInjectingIoBackend::add_rule(const FaultRule& rule) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t base = seen_[static_cast<int>(rule.opcode)];
  rules_.push_back(Armed{rule, base + std::max<uint64_t>(rule.nth, 1)});
}

void FaultInjectingIoBackend::hang_file(std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  hung_part_ = std::move(path_part);
}

void FaultInjectingIoBackend::answer_hung(int error) {
  std::lock_guard<std::mutex> lock(mu_);
  hung_part_.clear();
  answer_error_ = error;
  ++answers_;
  answered_.notify_all();
}

void FaultInjectingIoBackend::hang_in_system_calls() {
  std::lock_guard<std::mutex> lock(mu_);
  hang_in_calls_ = true;
}

int32_t FaultInjectingIoBackend::system_call(const IoRequest& request) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto hung = [&] {
      const auto file = opened_.find(request.fd);
      return !hung_part_.empty() && file != opened_.end() &&
             file->second.find(hung_part_) != std::string::npos;
    };
    if (hung()) {
      const uint64_t answers = answers_;
      ++injected_;
      answered_.wait(lock, [&] { return answers_ != answers; });
      if (answer_error_ != 0) return -answer_error_;
    }
  }
  return run_io_request(request);
}

uint64_t FaultInjectingIoBackend::answers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answers_;
}

int FaultInjectingIoBackend::answer_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answer_error_;
}

void FaultInjectingIoBackend::fail_open(std::string path_part, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  open_part_ = std::move(path_part);
  open_error_ = error;
}

void FaultInjectingIoBackend::fail_file(std::string path_part, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_part_ = std::move(path_part);
  dead_error_ = error;
  dead_writes_only_ = false;
}

void FaultInjectingIoBackend::fail_file_writes(std::string path_part, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_part_ = std::move(path_part);
  dead_error_ = error;
  dead_writes_only_ = true;
}

Status FaultInjectingIoBackend::dead_file_failure(IoOpcode op, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dead_error_ == 0 || path.find(dead_part_) == std::string::npos) return Status();
  if (dead_writes_only_ && op != IoOpcode::kWrite) return Status();
  ++injected_;
  return errno_status(io_errno_code(dead_error_),
                      std::string(op == IoOpcode::kRead ? "read " : "write ") + path, dead_error_);
}

Status FaultInjectingIoBackend::read_at(int fd, const std::string& path, void* buf, std::size_t len,
                                        uint64_t offset) {
  KVTIER_RETURN_IF_ERROR(dead_file_failure(IoOpcode::kRead, path));
  return inner_->read_at(fd, path, buf, len, offset);
}

Status FaultInjectingIoBackend::write_at(int fd, const std::string& path, const void* buf,
                                         std::size_t len, uint64_t offset) {
  KVTIER_RETURN_IF_ERROR(dead_file_failure(IoOpcode::kWrite, path));
  return inner_->write_at(fd, path, buf, len, offset);
}

void FaultInjectingIoBackend::fail_allocate(int error) {
  std::lock_guard<std::mutex> lock(mu_);
  allocate_error_ = error;
}

void FaultInjectingIoBackend::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  bad_.clear();
  next_bad_[0] = next_bad_[1] = 0;
  open_part_.clear();
  open_error_ = 0;
  dead_part_.clear();
  dead_error_ = 0;
  dead_writes_only_ = false;
  allocate_error_ = 0;
}

uint64_t FaultInjectingIoBackend::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

uint64_t FaultInjectingIoBackend::requests(IoOpcode op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_[static_cast<int>(op)];
}

void FaultInjectingIoBackend::add_bad_range(IoOpcode opcode, uint64_t offset, uint64_t length,
                                            int error) {
  std::lock_guard<std::mutex> lock(mu_);
  bad_.push_back(BadRange{opcode, offset, length, error});
}

void FaultInjectingIoBackend::make_next_bad(IoOpcode opcode, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  next_bad_[static_cast<int>(opcode)] = error;
}

FaultInjectingIoBackend::Decision FaultInjectingIoBackend::decide(const IoRequest& request) {
  const IoOpcode op = request.opcode;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < request.iovcnt; ++i) bytes += request.iov[i].iov_len;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t index = ++seen_[static_cast<int>(op)];
  if (const int error = std::exchange(next_bad_[static_cast<int>(op)], 0); error != 0) {
    bad_.push_back(BadRange{op, request.offset, bytes, error});
  }
  if (!hung_part_.empty() && !hang_in_calls_) {
    const auto file = opened_.find(request.fd);
    if (file != opened_.end() && file->second.find(hung_part_) != std::string::npos) {
      FaultRule rule;
      rule.opcode = op;
      rule.kind = FaultKind::kHang;
      return Decision{true, rule};
    }
  }
  if (dead_error_ != 0 && (!dead_writes_only_ || op == IoOpcode::kWrite)) {
    const auto file = opened_.find(request.fd);
    if (file != opened_.end() && file->second.find(dead_part_) != std::string::npos) {
      FaultRule rule;
      rule.opcode = op;
      rule.kind = FaultKind::kError;
      rule.error = dead_error_;
      return Decision{true, rule};
    }
  }
  for (const BadRange& b : bad_) {
    if (b.opcode == op && request.offset < b.offset + b.length &&
        b.offset < request.offset + bytes) {
      FaultRule rule;
      rule.opcode = op;
      rule.kind = FaultKind::kError;
      rule.error = b.error;
      return Decision{true, rule};
    }
  }
  for (const Armed& a : rules_) {
    if (a.rule.opcode == op && index >= a.first && index < a.first + a.rule.count) {
      return Decision{true, a.rule};
    }
  }
  return Decision{};
}

void FaultInjectingIoBackend::undo(IoOpcode op) {
  std::lock_guard<std::mutex> lock(mu_);
  --seen_[static_cast<int>(op)];
}

void FaultInjectingIoBackend::fired() {
  std::lock_guard<std::mutex> lock(mu_);
  ++injected_;
}

Status FaultInjectingIoBackend::flip_byte_on_disk(const std::string& path, uint64_t offset) {
  ScopedFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return errno_status(StatusCode::kIoError, "open " + path + " to corrupt it", errno);
  unsigned char b = 0;
  if (::pread(fd.get(), &b, 1, static_cast<off_t>(offset)) != 1) {
    return errno_status(StatusCode::kIoError, "pread " + path + " at " + std::to_string(offset),
                        errno);
  }
  b ^= 0xFF;
  if (::pwrite(fd.get(), &b, 1, static_cast<off_t>(offset)) != 1) {
    return errno_status(StatusCode::kIoError, "pwrite " + path + " at " + std::to_string(offset),
                        errno);
  }
  return Status();
}

Result<ScopedFd> FaultInjectingIoBackend::open(const std::string& path, int flags, mode_t mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_error_ != 0 && path.find(open_part_) != std::string::npos) {
      const int err = std::exchange(open_error_, 0);
      ++injected_;
      return errno_status(open_errno_code(err), "open " + path, err);
    }
  }
  Result<ScopedFd> fd = inner_->open(path, flags, mode);
  if (fd.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    opened_[fd->get()] = path;  // a number reused after a close names the new file
  }
  return fd;
}

void FaultInjectingIoBackend::treat_as_mount_point(std::string dir) {
  std::lock_guard<std::mutex> lock(mu_);
  mount_points_.push_back(std::move(dir));
}

Result<bool> FaultInjectingIoBackend::is_mount_point(const std::string& dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(mount_points_.begin(), mount_points_.end(), dir) != mount_points_.end()) {
      return true;
    }
  }
  return inner_->is_mount_point(dir);
}

void FaultInjectingIoBackend::treat_as_block_device(std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  device_part_ = std::move(path_part);
}

Result<FileInfo> FaultInjectingIoBackend::stat(int fd, const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(FileInfo info, inner_->stat(fd, path));
  std::lock_guard<std::mutex> lock(mu_);
  if (!device_part_.empty() && path.find(device_part_) != std::string::npos) {
    info.block_device = true;
    info.device = std::hash<std::string>{}(path);
    info.inode = 0;
  }
  return info;
}

Status FaultInjectingIoBackend::allocate(int fd, const std::string& path, uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (allocate_error_ != 0) {
      const int err = std::exchange(allocate_error_, 0);
      ++injected_;
      return errno_status(io_errno_code(err),
                          "fallocate " + path + " to " + std::to_string(size) + " bytes", err);
    }
  }
  return inner_->allocate(fd, path, size);
}

Result<std::unique_ptr<IoQueue>> FaultInjectingIoBackend::make_queue(const QueueOptions& options) {
  QueueOptions o = options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (hang_in_calls_) {
      o.allow_io_uring = false;
      o.sync_call = [this](const IoRequest& r) { return system_call(r); };
    }
  }
  KVTIER_ASSIGN_OR_RETURN(auto inner, inner_->make_queue(o));
  return std::unique_ptr<IoQueue>(std::make_unique<FaultQueue>(*this, std::move(inner)));
}

}  // namespace kvtier
