// The NVMe store's I/O seam: IoBackend (files) and IoQueue (asynchronous reads and writes).
//
// The store never calls open/pread/io_uring directly; it goes through these two interfaces so a
// wrapper (tiers/fault_injection.hpp) can fail the k-th read or write with EIO or ENOSPC, return a
// short count, return -EAGAIN, refuse to create a path, or flip a byte on disk — and the tests can
// prove that every such fault becomes a Status and a miss, never a crash or wrong data served.
//
// IoQueue is a submission/completion queue in io_uring's shape: requests carry a caller-chosen
// 64-bit tag (never 0, which is reserved), `submit` accepts a prefix of what it is given (the rest
// stays with the caller — nothing is dropped when the queue is full), and `wait` returns
// completions as (tag, bytes or -errno), exactly one per accepted request. A queue is used by one
// thread (its I/O thread); only wake() may be called from others, to interrupt a blocking wait().
// Buffers and iovec arrays named by a request must stay valid until its completion is returned.
//
// Implementations: io_uring (one ring per queue, optional SQPOLL, fixed buffers when registration
// is allowed, wake() through a multishot poll on an eventfd, or one-shot polls re-armed per wake on
// kernels before 5.13: uring_queue.cpp) and a synchronous fallback (preadv/pwritev on a pool of
// the queue's own threads, at most half of them held by one file: sync_queue.cpp) used when
// io_uring is refused (seccomp, io_uring_disabled), chosen by make_queue with one log line.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"
#include "tiers/scoped_fd.hpp"

namespace kvtier {

enum class IoOpcode : uint8_t { kRead = 0, kWrite = 1 };

struct IoRequest {
  uint64_t tag = 0;  // != 0
  IoOpcode opcode = IoOpcode::kRead;
  int fd = -1;
  uint64_t offset = 0;
  const iovec* iov = nullptr;
  uint32_t iovcnt = 0;
  // Index of a registered buffer that holds the single iovec (fixed I/O), or -1.
  int buffer_index = -1;
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;  // bytes transferred, or -errno
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;

  virtual std::string_view kind() const = 0;  // "io_uring", "io_uring+sqpoll", "sync"
  // Most requests in flight at once.
  virtual uint32_t depth() const = 0;

  // Registers buffers for fixed I/O (buffer_index refers to this list). kUnavailable when the
  // kernel refuses (memlock limit, old kernel); the caller then submits plain requests.
  virtual Status register_buffers(std::span<const iovec> buffers) = 0;

  // Queues and submits a prefix of `requests`; returns how many were accepted (0 when full).
  virtual Result<std::size_t> submit(std::span<const IoRequest> requests) = 0;

  // Appends completions to `out`. Blocks up to `timeout_ms` (-1: no limit) when none is ready;
  // returns early, possibly with none, after wake().
  virtual Status wait(std::vector<IoCompletion>& out, int timeout_ms) = 0;

  // Thread-safe: interrupts a blocking wait().
  virtual void wake() noexcept = 0;
};

struct FileInfo {
  uint64_t size = 0;  // bytes (file length, or the size of a block device)
  bool block_device = false;
  // O_DIRECT offset/length granularity: statx's STATX_DIOALIGN (Linux >= 6.1, where the
  // filesystem reports it), else the logical block size of the device the file lives on (sysfs;
  // BLKSSZGET for a block device). `logical_block_known` false: no source said, and 4096 is assumed
  // (a multiple of every common sector size, so O_DIRECT works on 512-byte and 4 KiB drives alike).
  uint32_t logical_block = 4096;
  bool logical_block_known = false;
  // Which file this is, so two paths naming one file (a hard link, a symlink, "a//b") are caught:
  // st_dev and st_ino of a regular file, st_rdev (inode 0) of a block device. A backend that
  // cannot tell leaves `identified` false and the check is skipped.
  bool identified = false;
  uint64_t device = 0;
  uint64_t inode = 0;
};

// The directory `path` lies in: "." for a bare name, "/" for one at the root.
std::string directory_of(const std::string& path);

// Both describe one file or one block device (reached through two paths, or opened twice).
inline bool same_file(const FileInfo& a, const FileInfo& b) {
  return a.identified && b.identified && a.block_device == b.block_device && a.device == b.device &&
         a.inode == b.inode;
}

// How an io_uring queue arms the poll on its wake-up eventfd (see uring_queue.cpp).
enum class WakePoll : uint8_t {
  kAuto = 0,     // multishot (Linux >= 5.13); one-shot polls, re-armed per wake, where refused
  kOneShot = 1,  // one-shot polls only
  // Tests of the fallback: the multishot request carries a poll flag no kernel knows, so it
  // completes with -EINVAL exactly as on a kernel without multishot polls.
  kRefusedMultishot = 2,
};

struct QueueOptions {
  uint32_t depth = 64;
  bool sqpoll = false;
  bool allow_io_uring = true;  // false: the synchronous queue (tests, fallback)
  WakePoll wake_poll = WakePoll::kAuto;
  // The synchronous queue's system call for one request, returning bytes or -errno; empty:
  // preadv/pwritev. Tests put a drive that hangs in a system call here.
  std::function<int32_t(const IoRequest&)> sync_call;
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // open(2) with `flags` and `mode`; errors name the path and errno.
  virtual Result<ScopedFd> open(const std::string& path, int flags, mode_t mode) = 0;
  // mkdir -p with mode 0700 for missing components.
  virtual Status make_dirs(const std::string& dir) = 0;
  // Whether directory `dir` is the root of a mounted file system: "/", or its device differs from
  // its parent's. kNotFound when it does not exist. (A lost drive's file is created again only at
  // its drive's mount point: nvme_store.hpp.)
  virtual Result<bool> is_mount_point(const std::string& dir) = 0;
  virtual Result<FileInfo> stat(int fd, const std::string& path) = 0;
  // Reserves `size` bytes (fallocate, or ftruncate where unsupported).
  virtual Status allocate(int fd, const std::string& path, uint64_t size) = 0;
  // Whole-buffer synchronous I/O for superblocks; short transfers are retried, EOF is an error.
  virtual Status read_at(int fd, const std::string& path, void* buf, std::size_t len,
                         uint64_t offset) = 0;
  virtual Status write_at(int fd, const std::string& path, const void* buf, std::size_t len,
                          uint64_t offset) = 0;
  virtual Status sync(int fd, const std::string& path) = 0;

  virtual Result<std::unique_ptr<IoQueue>> make_queue(const QueueOptions& options) = 0;
};

// The real thing: POSIX files and io_uring (falling back to the synchronous queue).
std::shared_ptr<IoBackend> posix_io_backend();

// Where the POSIX backend looks for a file's O_DIRECT alignment (tests point it elsewhere).
struct PosixIoOptions {
  std::string sysfs_root = "/sys";
  bool use_statx_dioalign = true;  // false: as on a kernel or filesystem without STATX_DIOALIGN
  bool io_uring = true;            // false: always the synchronous queue, as where it is refused
};
std::shared_ptr<IoBackend> posix_io_backend(const PosixIoOptions& options);

// The logical block size of block device major:minor from sysfs under `sysfs_root`:
// dev/block/M:m/queue/logical_block_size, or, for a partition (dev/block/M:m/partition exists),
// its disk's dev/block/M:m/../queue/logical_block_size. 0 when the file is missing or does not
// hold a power of two from 512 to 65536.
uint32_t sysfs_logical_block_size(const std::string& sysfs_root, uint32_t major, uint32_t minor);

// The synchronous queue's system call for `request`: preadv or pwritev (retried on EINTR), the
// bytes moved or -errno.
int32_t run_io_request(const IoRequest& request);

// Direct constructors, for tests and for the fault-injection wrapper.
Result<std::unique_ptr<IoQueue>> make_uring_queue(const QueueOptions& options);
Result<std::unique_ptr<IoQueue>> make_sync_queue(const QueueOptions& options);

// How an io_uring queue is woken, for tests and diagnostics; call it on the queue's own thread.
struct UringWakeState {
  bool multishot = false;  // the wake poll is multishot; false: one-shot, re-armed after each wake
  // False: the kernel refused even one-shot polls, and wait() sleeps in short naps instead.
  bool polling = true;
  uint64_t arms = 0;  // wake polls armed so far (stays 1 while one multishot poll lives)
};
// kInvalidArgument when `queue` did not come from make_uring_queue.
Result<UringWakeState> uring_wake_state(const IoQueue& queue);

}  // namespace kvtier
