// The NVMe store's I/O side, shared by nvme_store.cpp and nvme_worker.cpp (not installed): the
// operations the store posts (a block written or read, one page read, a scan of extent headers, a
// probe of a file out of service) and the Worker that carries them out. Each Worker is one I/O
// thread with its own queue (io_uring, or the synchronous fallback): engine threads post
// operations into its inbox under a mutex; the thread alone prepares them (header slot, segments
// of contiguous memory and disk, registered buffers where they fit), submits, handles completions
// and short transfers, checks checksums and completes each operation's TransferState. An engine
// thread posting an operation only takes the inbox's lock; stop() (the store's destructor) joins
// the thread.
//
// Hung drives (see "Hung drives" in nvme_store.hpp): each request submitted carries its submission
// time, the thread's waits are bounded by the earliest I/O timeout, and a request past it is handed
// to the store as unanswered. An operation for a file with requests unanswered fails instead of
// taking a slot, and with several files none holds more than half of the thread's slots
// (operations for a file at its share wait while later ones, for other files, go ahead).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tiers/aligned_bytes.hpp"
#include "tiers/nvme_store.hpp"

namespace kvtier {

// A contiguous run in memory that maps to a contiguous range on disk may use a registered buffer;
// past this many runs one vectored request is cheaper than several fixed ones.
inline constexpr std::size_t kMaxFixedRuns = 4;
inline constexpr std::size_t kMaxIov = 1024;  // IOV_MAX
// io_uring's limit per registered buffer.
inline constexpr uint64_t kMaxFixedBuffer = uint64_t{1} << 30;

// The extent headers one scan reads, each read an Op of its own; the scan waits on `cv`.
struct ScanBatch {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t remaining = 0;
  // Per extent: the decoded header, or the reason there is none.
  std::vector<std::optional<ExtentHeader>> headers;
  std::vector<StatusCode> codes;
};

// One I/O request's share of an Op: a contiguous disk range and the memory it moves, resubmitted
// from where it stopped after a short transfer.
struct Segment {
  NvmeStore::Op* op = nullptr;
  IoOpcode opcode = IoOpcode::kRead;
  uint64_t offset = 0;  // advances past completed bytes
  std::vector<iovec> iov;
  std::size_t iov_first = 0;  // first iovec with bytes left
  uint64_t remaining = 0;
  int buffer_index = -1;
  // With the queue from submission to completion; `unanswered` once past the I/O timeout.
  bool in_flight = false;
  bool unanswered = false;
  std::chrono::steady_clock::time_point submitted_at;
};

struct NvmeStore::Op {
  enum class Kind : uint8_t { kWrite, kReadBlock, kReadPage, kScan, kProbe };
  Kind kind = Kind::kReadBlock;
  std::shared_ptr<TransferState> state;  // null for scans and probes
  BlockKey key;
  uint32_t extent = 0;
  uint32_t file = 0;
  // The file's descriptor when the operation was made, held open by the operation: a probe may
  // give the file a new one (a replaced drive), and the old one closes after the last operation
  // made with it.
  SharedFd fd;
  uint64_t extent_offset = 0;
  uint64_t generation = 0;
  uint32_t layer = 0;
  ChecksumKind checksum_kind = ChecksumKind::kXxh3;
  std::vector<uint64_t> page_sums;  // write: computed; read_page: the expected one
  std::vector<std::byte*> pages;
  ScanBatch* scan = nullptr;
  // kProbe: the file's superblock is read into this buffer, owned by the operation (a drive that
  // answers late still writes into memory that exists); or, when `probe_writes`, written from it:
  // the superblock just read, back (a drive must take writes to be readmitted), or, when
  // `probe_formats`, a new one for a blank file found in place of the lost one.
  AlignedBytes probe_buffer;
  uint64_t probe_bytes = 0;
  bool probe_writes = false;
  bool probe_formats = false;
  uint64_t probe_extents = 0;  // probe_writes: the file's extents in service once it lands
  // kProbe of a block device: `fd` is its path opened afresh, the file's own descriptor once the
  // probe readmits it. A device replaced under its name has the old one's number as often as not
  // (the kernel reuses freed minors), so no identity check can tell it apart; the old descriptor
  // would reach the removed drive for ever. A probe that fails closes it.
  bool adopt_fd = false;

  // Owned by the I/O thread from here on.
  int slot = -1;
  std::byte* header = nullptr;
  std::vector<Segment> segments;
  std::size_t outstanding = 0;
  StatusCode error_code = StatusCode::kOk;
  std::string error_message;
  int io_errno = 0;  // the errno of the first failure, when a request failed with one
  // A write, scan or probe (or a read whose caller takes buffers back later: on_buffers_released)
  // whose drive left a request unanswered past the I/O timeout: its caller was told then; the rest
  // of it only frees what it holds (slot, extent, the caller's buffers) when the drive answers.
  bool abandoned = false;

  void fail(const Status& s, int err = 0) {
    if (error_code == StatusCode::kOk) {
      error_code = s.code();
      error_message = s.message();
      io_errno = err;
    } else {
      s.ignore();
    }
  }
  Status error() const {
    return error_code == StatusCode::kOk ? Status() : Status(error_code, error_message);
  }
};

class NvmeStore::Worker {
 public:
  // `io_timeout` 0: requests never time out.
  Worker(NvmeStore& store, std::unique_ptr<IoQueue> queue, uint32_t max_ops,
         std::chrono::milliseconds io_timeout)
      : store_(store),
        queue_(std::move(queue)),
        max_ops_(max_ops),
        io_timeout_(io_timeout),
        active_(max_ops) {}

  ~Worker() { stop(); }

  Status start(const std::vector<iovec>& fixed_buffers, bool use_fixed);
  void post(std::unique_ptr<Op> op);
  void stop();

  std::string_view kind() const { return queue_->kind(); }
  bool fixed_active() const { return registered_; }

 private:
  void run();
  void admit();
  int fixed_index(const std::byte* p, uint64_t len) const;

  struct Piece {
    std::byte* mem;
    uint64_t len;
    uint64_t disk;
  };
  void prepare(Op& op);
  void submit_ready();
  // Hands each completion to on_completion.
  void handle(const std::vector<IoCompletion>& done);
  // How long the next wait may block (`timeout_ms`, -1: no limit) before a request in flight
  // passes the I/O timeout.
  int ms_to_next_timeout(int timeout_ms) const;
  // Finds the requests past the I/O timeout (on_unanswered), once the answers that arrived are
  // handled, and when the next one will be.
  void find_unanswered();
  // `s` passed the I/O timeout: the store counts it against its drive, and a write or scan is
  // abandoned (its caller told now). A read is abandoned only when its caller set
  // on_buffers_released: the drive may still fill the caller's memory, so otherwise it ends only
  // when the drive answers. An abandoned transfer's buffers are released when the drive answers.
  void on_unanswered(Segment& s);
  std::string describe(const Segment& s) const;
  void on_completion(Segment* s, int32_t res);
  Status verify_block(const Op& op) const;
  Status verify_page(const Op& op) const;
  std::string block_context(const Op& op, const char* what) const;
  void finish(Op& op);
  // Frees op's header slot and destroys it.
  void release(Op& op);
  // Completes an operation that never reached the kernel: cancelled, or with `why`.
  void cancel(std::unique_ptr<Op> op);
  void cancel(std::unique_ptr<Op> op, const Status& why);

  NvmeStore& store_;
  std::unique_ptr<IoQueue> queue_;
  const uint32_t max_ops_;
  const std::chrono::milliseconds io_timeout_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Op>> inbox_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool sleeping_ = false;                   // guarded by mu_
  std::thread thread_;

  // I/O thread only.
  std::deque<std::unique_ptr<Op>> backlog_;
  std::vector<std::unique_ptr<Op>> active_;  // by header slot
  std::size_t active_count_ = 0;
  std::vector<uint32_t> active_in_file_;  // operations holding a slot, per file
  uint32_t slots_per_file_ = 0;           // the most one file may hold
  std::deque<Segment*> ready_;
  std::vector<IoRequest> requests_;
  uint32_t in_flight_ = 0;
  // No request in flight passes the I/O timeout before this.
  std::chrono::steady_clock::time_point next_timeout_ =
      std::chrono::steady_clock::time_point::max();
  AlignedBytes slab_;
  std::vector<int> free_slots_;
  std::vector<iovec> regions_;  // registered buffers, in registration order
  bool registered_ = false;
};

}  // namespace kvtier
