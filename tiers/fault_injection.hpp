// FaultInjectingIoBackend: an IoBackend (and IoQueue) wrapper that breaks I/O on purpose.
//
// Used by the tests (and available to fault drills) to prove that every failure of the NVMe path
// becomes a Status and a miss: the k-th read or write fails with EIO, ENOSPC or any errno; returns
// a short count (the store must requeue the rest); returns -EAGAIN (requeue); lands with one byte
// flipped on disk (a write) or in memory (a read) so checksums must catch it; opening or
// allocating a file fails. Faults are armed as rules counted per opcode over every request the
// wrapped queues see, from the moment the rule is added: `nth = 1` hits the next matching request.
// A bad range is a bad sector instead: every request of its opcode that touches those bytes (of
// any file the queues write) fails with its errno, for as long as the range is armed. A dead file
// is a dead drive: every request to a file opened through this backend whose path contains the
// given part fails. A hung file is a hung drive: its requests are held, unanswered, until the test
// lets the drive answer (done, or failed with an errno, as a kernel's own timeout would).
//
// Threading: rules and counters are shared by all queues under one mutex (held for bookkeeping
// only); each wrapped queue is used by its I/O thread like any IoQueue. Requests the fault replaces
// (errors, -EAGAIN) never reach the kernel and complete on the next wait().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tiers/io_backend.hpp"

namespace kvtier {

enum class FaultKind : uint8_t {
  kError = 0,  // complete with -error, no I/O
  kShort = 1,  // submit only the first half (aligned down to 512 bytes, at least 512)
  kAgain = 2,  // complete with -EAGAIN, no I/O
  kCorrupt =
      3,      // do the I/O, then flip byte `corrupt_at` of it: on disk (write) or in memory (read)
  kHang = 4,  // held, neither done nor completed, until answer_hung()
};

struct FaultRule {
  IoOpcode opcode = IoOpcode::kRead;
  FaultKind kind = FaultKind::kError;
  uint64_t nth = 1;         // the nth matching request from now (1 = the next one)
  uint32_t count = 1;       // how many consecutive matching requests from there
  int error = 5;            // errno for kError (EIO)
  uint64_t corrupt_at = 0;  // kCorrupt: byte offset within the request
};

class FaultInjectingIoBackend final : public IoBackend {
 public:
  explicit FaultInjectingIoBackend(std::shared_ptr<IoBackend> inner = posix_io_backend());

  void add_rule(const FaultRule& rule);
  // Every `opcode` request overlapping bytes [offset, offset + length) fails with -error (EIO:
  // a bad sector), until clear().
  void add_bad_range(IoOpcode opcode, uint64_t offset, uint64_t length, int error = 5);
  // The bytes the next `opcode` request touches become a bad range of that opcode (it fails, and
  // so does every later one touching them): a bad sector wherever the caller writes or reads next.
  void make_next_bad(IoOpcode opcode, int error = 5);
  // Every request to a file whose path contains `path_part` (opened through this backend, before
  // or after) fails with -error, until clear(): a dead drive.
  void fail_file(std::string path_part, int error = 5);
  // The same for writes only: a drive that went read-only (its reads still succeed).
  void fail_file_writes(std::string path_part, int error = 5);
  // Every request to a file whose path contains `path_part` is held, unanswered, until
  // answer_hung(): a hung drive (clear() does not end it). The queue then polls: it sleeps at
  // most 5 ms at a time while it holds a request.
  void hang_file(std::string path_part);
  // The hung drive answers: every request held so far is done (error 0) or completes with
  // -error, and later requests to that file go through.
  void answer_hung(int error = 0);
  // From the next make_queue on: queues are the synchronous fallback (io_uring refused), and a hung
  // file's requests block the queue's threads inside their system call, as a drive that stops
  // answering holds a thread in preadv, instead of being held by the wrapper.
  void hang_in_system_calls();
  uint64_t answers() const;  // answer_hung() calls so far
  int answer_error() const;  // the error of the last one

  // The next open of a path containing `path_part` fails with `error` (e.g. EACCES, ENOSPC).
  void fail_open(std::string path_part, int error);
  // The next allocate() (fallocate) fails with `error` (e.g. ENOSPC).
  void fail_allocate(int error);
  // is_mount_point(dir) says true for `dir` from now on, as if a drive were mounted there.
  void treat_as_mount_point(std::string dir);
  // stat() reports files whose path contains `path_part` as block devices of their current size
  // from now on (the store neither allocates nor grows them), identified as a device node is: by
  // a device number that comes from the path alone, so a file replaced at that path keeps it, as
  // a drive replaced under its name often keeps the old one's number.
  void treat_as_block_device(std::string path_part);
  void clear();

  uint64_t injected() const;             // faults that fired
  uint64_t requests(IoOpcode op) const;  // requests seen

  // Flips (xor 0xFF) the byte at `offset` of `path` through the page cache; a later O_DIRECT read
  // sees it (the kernel writes the dirty page back before a direct read of that range).
  static Status flip_byte_on_disk(const std::string& path, uint64_t offset);

  // IoBackend
  Result<ScopedFd> open(const std::string& path, int flags, mode_t mode) override;
  Status make_dirs(const std::string& dir) override { return inner_->make_dirs(dir); }
  Result<bool> is_mount_point(const std::string& dir) override;
  Result<FileInfo> stat(int fd, const std::string& path) override;
  Status allocate(int fd, const std::string& path, uint64_t size) override;
  // Synchronous reads and writes (a store's superblock) fail on a dead file too.
  Status read_at(int fd, const std::string& path, void* buf, std::size_t len,
                 uint64_t offset) override;
  Status write_at(int fd, const std::string& path, const void* buf, std::size_t len,
                  uint64_t offset) override;
  Status sync(int fd, const std::string& path) override { return inner_->sync(fd, path); }
  Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& options) override;

  // Shared by the wrapped queues: decides the fate of one request.
  struct Decision {
    bool fire = false;
    FaultRule rule;
  };
  Decision decide(const IoRequest& request);
  void undo(IoOpcode op);  // the request was not accepted after all: uncount it
  void fired();
  // The synchronous queue's system call (hang_in_system_calls): blocks while `request`'s file is
  // hung, then fails with the answer's error or runs.
  int32_t system_call(const IoRequest& request);
  // The failure of a synchronous `op` on `path` when it is a dead file, else OK.
  Status dead_file_failure(IoOpcode op, const std::string& path);

 private:
  struct Armed {
    FaultRule rule;
    uint64_t first;  // absolute index (1-based) of the first request it hits
  };

  struct BadRange {
    IoOpcode opcode;
    uint64_t offset;
    uint64_t length;
    int error;
  };

  std::shared_ptr<IoBackend> inner_;
  mutable std::mutex mu_;
  std::vector<Armed> rules_;   // guarded by mu_
  std::vector<BadRange> bad_;  // guarded by mu_
  int next_bad_[2] = {0, 0};   // per opcode: the errno the next request's bytes go bad with
  uint64_t seen_[2] = {0, 0};  // guarded by mu_
  uint64_t injected_ = 0;      // guarded by mu_
  std::string open_part_;      // guarded by mu_
  std::unordered_map<int, std::string> opened_;  // fd -> path, of every open; guarded by mu_
  std::string hung_part_;                        // guarded by mu_
  bool hang_in_calls_ = false;                   // guarded by mu_
  std::condition_variable answered_;             // hung_part_ cleared (hang_in_calls_)
  uint64_t answers_ = 0;                         // guarded by mu_
  int answer_error_ = 0;                         // guarded by mu_
  std::string dead_part_;                        // guarded by mu_
  int dead_error_ = 0;                           // guarded by mu_
  bool dead_writes_only_ = false;                // guarded by mu_
  int open_error_ = 0;                           // guarded by mu_
  int allocate_error_ = 0;                       // guarded by mu_
  std::vector<std::string> mount_points_;        // guarded by mu_
  std::string device_part_;                      // guarded by mu_
};

}  // namespace kvtier
