// NvmeStore: the NVMe tier — blocks in fixed-size extents over one or more files or block devices,
// read and written with O_DIRECT through io_uring.
//
// Layout and format: tiers/nvme_format.hpp (superblock per file, one extent per block: a header
// with key, geometry fingerprint, generation and per-page checksums, then the block's pages
// contiguously, each at an aligned stride — one I/O moves a block, one aligned sub-range a page).
// The alignment, fixed when a store is made and kept in its superblock, is the largest O_DIRECT
// granularity of its files (FileInfo::logical_block); reopening refuses a store aligned finer than
// a device reports, never for a granularity that is only assumed.
//
// Threads: `io_threads` I/O threads, each owning one IoQueue (one io_uring ring) and a slab of
// header buffers. A submit call validates, updates the index, computes the page checksums of a
// write on the caller's thread, and posts the operation to a thread (round robin). The thread keeps
// at most `queue_depth` operations in flight, turns each into as few requests as the buffers allow
// (one registered-buffer request per contiguous run when the buffers lie in the registered host
// pool, else one vectored request), submits in batches, requeues short transfers and -EAGAIN,
// accounts for every completion, and never drops a request the queue cannot take yet (it waits in
// order). Reads verify the header and every page checksum on the I/O thread before completing.
// Completions (callbacks, eventfd) run on the I/O thread.
//
// Index: key -> {extent, generation, state, page checksums}, one mutex (index_mu_) held only for
// map and counter updates — never across I/O, checksums or callbacks. Lock order: index_mu_, then
// a worker's inbox mutex (never the reverse). An extent being read is not reused: erase and
// checksum failures unlink the key at once and free the extent when its last reader finishes.
//
// Restart: the index is rebuilt by scanning every extent header at open (batched reads at queue
// depth), not from a manifest. Rejected: a manifest, because it must be rewritten on every block
// write to stay exact (doubling small writes) or else it goes stale after a crash and needs the
// scan anyway; the scan costs one 4 KiB read per extent once per start. Headers whose checksum,
// geometry or store id do not match are dropped; for a key found twice the higher generation wins.
// Page data is verified on every read, so a torn write is found when read and dropped, never
// served. Writes are not fsync'ed: this is a cache, and losing the last writes in a crash only
// loses hits. A store written with another geometry is refused with a message naming both.
//
// Pages are stored in the store's PageFormat: as computed, or fp8 with a scale trailer. The store
// never converts; its callers hand it pages already in that format (ConvertingStore does it for
// the transfer engine), and geometry() is the geometry of the stored pages.
//
// Erase is in memory only: an erased block may reappear after a restart, which is harmless — its
// key still names exactly those bytes, and the scan verifies the header as for any other block.
// Erasing a block still being written marks it; the write, once done, frees its extent.
//
// Bad extents: a read or write that fails with a media error (is_media_error: EIO, ENODATA,
// EILSEQ) blames the extent it touched. The extent is retired instead of freed, so the next
// block does not land on the same sectors (the allocator's free lists are LIFO: a freed extent
// is soon handed out again, and in a test one bad sector failed every later write). A block
// whose read failed so stays readable (an I/O error is not proof of bad data; its callers drop it
// if they choose) and its extent is retired when the block is erased. capacity_blocks() counts
// the extents left in service and retired_blocks() the others, so that the scheduler's count can
// shrink with it.
// At most one extent in 32 (at least one) is retired: past that the device fails as a whole,
// not at a few sectors, and retiring more would only shrink the cache (the scheduler pauses
// writing to a disk that keeps failing). Retirement lasts until the store is reopened (or its
// drive is readmitted, below); a drive remaps a bad sector when it is written again, so a restart
// gives the extent another chance.
//
// Dead drives: with the store over several files (one per drive), a file whose requests fail
// with media errors tiers.nvme.out_of_service_after_failures times in a row (8), none succeeding
// between, is out of service (NvmeFileHealth; not the last one in service) until a probe finds it
// answering again (below) or the store is reopened. Its free extents are retired at once, so no
// block lands there again; its blocks are dropped from the index and listed for
// take_lost_blocks(), so the scheduler forgets them before it plans a read of one; every extent of
// it freed later is retired too. Without this, once the
// cap above was reached the dead drive's freed extents came round again and failed write after
// write, until the scheduler paused writing to every drive. TransferStats::files_out_of_service
// counts them.
//
// Readmission (nvme_store_readmit.cpp): a drive often answers again after the kernel resets its
// controller. tiers.nvme.readmit_after_ms after a file went out (then after twice each wait
// before, while probes fail), the next write posted also posts a probe: an I/O thread reads the
// file's superblock, like any request (timeout, refusal while the drive holds unanswered
// requests), and writes the same bytes back (a drive gone read-only reads well, and would fail
// every write once readmitted). If it is this store's, for that file, and the write lands, the
// file is back in service, empty: its extents are handed out again, but those marked bad (they
// stay retired until a restart, so a drive taken out by a bad region does not meet it again), and
// retired_blocks() drops by as many, so the scheduler's count grows back. Its old blocks stay
// forgotten (the scheduler dropped them); their headers only come back at a restart, verified as
// any other. Writes are what need the extents back, so only writes trigger probes. A drive that
// still fails goes out again after as many failed requests as the first time, and waits longer for
// its next probe.
//
// Opening without a file: a store of several files opens without one whose path is missing,
// cannot be opened, or whose superblock cannot be read (a dead drive at start) or is damaged, as
// long as another file holds the store's superblock. That file is out of service from the start,
// with as many extents as the store's first file; its headers are not scanned, and it is probed
// like any other (the probe opens its path afresh; a file that holds fewer extents, a smaller block
// device, comes back with those, the rest of its place retired until a restart). With one file, a
// dead one still fails the open. nvme_open_plan.hpp states every rule of the open.
//
// Replacing a drive (nvme_store_replace.cpp): a file that is blank (empty, or zeros where the
// superblock goes: a new or discarded drive, a file created by hand) in place of one of an
// existing store is formatted as that file, empty, and used: at open, or by its probe while the
// store runs (the probe opens the path afresh, so a new file system mounted there is seen; the
// old descriptor closes when the last operation made with it ends). A block device is always probed
// through its name opened afresh, kept only if the probe readmits it: a drive hot-swapped under
// the same name often gets the old one's device number, so nothing else tells them apart, and
// the old descriptor would reach the removed drive for ever. A missing file is created only
// where its directory is a mount point: a path missing because its drive's file system did not
// mount would otherwise get a member on whatever file system lies beneath. A file or device that
// holds anything else is never formatted over (a device name may now name another drive). The
// old drive's blocks are gone, and its bad-sector marks with it. TransferStats::files_replaced
// counts them.
//
// Hung drives (nvme_store_hung.cpp): a drive that stops answering fails nothing, so the rules
// above never see it. A request in flight longer than tiers.nvme.io_timeout_ms counts against its
// file as a media error would (NvmeFileHealth), and while any such request is unanswered every new
// request to that file fails at once (kDeadlineExceeded, counted the same way): a hung drive among
// several is taken out of service after as many requests as a dead one, and a lone one is left to
// the scheduler's pauses. No request can be taken back from a drive: a write past its timeout is
// told it failed, and its extent (and header slot) stay reserved, as draining, until the drive
// answers (the answer is then dropped: the writer already knows the block is not there). Unlike
// any other transfer, it completes while the drive may still read its pages, so they must stay
// mapped (the host pool's always are) though the caller may reuse them: what the drive then
// writes is never served (the extent is freed unindexed, and at a restart its header's page
// checksums fail on the bytes written); on_buffers_released (transfer.hpp) runs when the drive
// answers. A read past its timeout fills the caller's memory if the drive ever answers, so it
// goes on until then (the kernel's own timeout bounds that), unless its caller set
// on_buffers_released: it then fails at its timeout like a write (kDeadlineExceeded), its extent
// stays counted as read, and its buffers are released when the drive answers, whatever it read
// dropped unverified. The scheduler does so, and holds the host frames until then, so a hung
// read fails its step at the I/O timeout, not at wait_timeout. At open, a header read past its
// timeout counts as unreadable, so a store opens past a hung drive. Closing the store waits for
// every answer. TransferStats counts io_timeouts and requests_unanswered.
//
// Writing a key again: a block already readable is refused with kAlreadyExists (equal keys mean
// equal bytes; callers count that as present). A block still being written is not written twice:
// the new write joins the one in flight — it moves no bytes, undoes an erase waiting for that
// write, and its Transfer completes right after the first one's with the same outcome: OK when the
// block is now readable, the first write's error when it failed (the block is then gone, and the
// rewriter knows it), kCancelled when that write was cancelled before its I/O started. Cancelling
// a joined write itself changes nothing; it is counted in the link stats only as the write it
// joined. Rejected: refusing the rewrite with kAlreadyExists (the earlier design) — a first write
// that then failed left its rewriter believing in a block that was lost; queueing the rewrite to
// write again after a failure — it hammers a failing disk with the same block, which callers avoid.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/transfer_stats.hpp"
#include "tiers/aligned_bytes.hpp"
#include "tiers/block_store.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/nvme_file_health.hpp"
#include "tiers/nvme_format.hpp"
#include "tiers/nvme_open_plan.hpp"

namespace kvtier {

struct NvmeStoreOptions {
  NvmeTierConfig config;
  // The I/O seam; the fault-injection wrapper goes here in tests.
  std::shared_ptr<IoBackend> backend = posix_io_backend();
  std::shared_ptr<TransferStats> stats;          // null: the store keeps its own
  std::shared_ptr<CompletionNotifier> notifier;  // null: no eventfd signal
  // Host memory to register as io_uring fixed buffers (the host pool's region).
  std::vector<iovec> fixed_buffers;
  // False: plain (non-fixed) requests even when registration would succeed.
  bool use_fixed_buffers = true;
};

// Where a block lives on disk (diagnostics and fault-injection tests).
struct ExtentPlace {
  std::string path;
  uint64_t offset = 0;  // byte offset of the extent (its header) in that file
  uint32_t extent = 0;
};

class NvmeStore final : public BlockStore {
 public:
  // Opens or creates the store files of `options.config.paths` (created 0600, parents 0700),
  // recovers the index of existing ones, and starts the I/O threads.
  static Result<std::unique_ptr<NvmeStore>> create(const PageFormat& format,
                                                   NvmeStoreOptions options);
  // A store of pages as the model computes them.
  static Result<std::unique_ptr<NvmeStore>> create(const Geometry& geometry,
                                                   NvmeStoreOptions options) {
    return create(PageFormat::as_computed(geometry), std::move(options));
  }
  // Cancels queued operations, waits for those in flight, stops the threads, closes the files.
  ~NvmeStore() override;

  const Geometry& geometry() const override { return geometry_; }
  const PageFormat& page_format() const { return format_; }
  std::size_t page_io_bytes() const override { return layout_.page_stride; }
  std::size_t buffer_alignment() const override { return layout_.io_align; }

  Result<Transfer> write_block(const BlockKey& key, std::span<const std::byte* const> pages,
                               TransferOptions options = {}) override;
  Result<Transfer> read_block(const BlockKey& key, std::span<std::byte* const> pages,
                              TransferOptions options = {}) override;
  Result<Transfer> read_page(const BlockKey& key, uint32_t layer, std::byte* page,
                             TransferOptions options = {}) override;

  Status erase(const BlockKey& key) override;
  bool contains(const BlockKey& key) const override;
  std::vector<BlockKey> keys() const override;

  uint64_t capacity_blocks() const override { return extents_->in_service(); }
  uint64_t used_blocks() const override { return extents_->used(); }
  uint64_t retired_blocks() const override { return extents_->retired(); }
  std::vector<BlockKey> take_lost_blocks() override;
  // The most extents media errors may retire (see the header).
  uint32_t max_retired_blocks() const { return max_retired_extents(extents_->capacity()); }
  Status audit() const override;

  const ExtentLayout& layout() const { return layout_; }
  Result<ExtentPlace> locate(const BlockKey& key) const;
  TransferStats& stats() const { return *stats_; }
  // "io_uring", "io_uring+sqpoll" or "sync"; whether fixed buffers and O_DIRECT are in use.
  std::string_view io_kind() const;
  bool fixed_buffers_active() const;
  bool direct_io() const { return direct_io_; }

  class Worker;  // one I/O thread and its ring (nvme_worker.hpp)
  struct Op;
  struct File {
    std::string path;
    SharedFd fd;  // shared with the operations made with it
    uint64_t extent_count = 0;
  };
  // "tiers.nvme.paths[index]", as errors name a file's config entry.
  static std::string path_key(std::size_t index);

 private:
  enum class EntryState : uint8_t { kWriting, kReady };
  struct Entry {
    uint32_t extent = 0;
    uint64_t generation = 0;
    EntryState state = EntryState::kWriting;
    bool erase_when_written = false;
    ChecksumKind checksum_kind = ChecksumKind::kXxh3;
    std::vector<uint64_t> page_sums;
    // Writes of the same key that joined this one while it was in flight (kWriting only).
    std::vector<std::shared_ptr<TransferState>> joined;
  };

  // A store file as open_files found it (the report), and what the open made of it.
  struct OpenedFile {
    StoreFileReport report;
    ScopedFd fd;  // invalid while missing, or when it could not be opened
    // Why the store opens without this file (the plan's reason, or a format that failed); empty
    // when it is in service.
    std::string absent;
    bool formatted_now = false;  // formatted by this open: it has no headers to scan
  };
  // A missing path just created.
  struct CreatedPath {
    ScopedFd fd;
    FileInfo info;
  };

  NvmeStore(const PageFormat& format, NvmeStoreOptions options);

  // Opening (nvme_open_plan.hpp states the rules): each path is opened and classified, the plan
  // made from what they all hold, and carried out.
  Status open_files();
  // Opens `path` read-write, O_DIRECT unless the file system refuses it (then every file is
  // opened buffered: direct_io_ becomes false). Created, with its directory, only when `create`.
  // `key` names the config entry in errors.
  Result<ScopedFd> open_store_path(const std::string& path, const std::string& key, bool create);
  // Checked before anything is read or formatted: the same file twice would hand out each of its
  // offsets to two extents, and both copies would look empty and be formatted over each other.
  // kInvalidArgument when `info` is the same file as one of `opened` other than `index`.
  static Status check_listed_once(const std::vector<OpenedFile>& opened, std::size_t index,
                                  const std::string& path, const FileInfo& info);
  // Opens file `index` of tiers.nvme.paths, never creating it, and classifies what it holds;
  // refuses one of `before` again.
  Result<OpenedFile> open_store_file(uint32_t index, const std::vector<OpenedFile>& before);
  // Creates missing path `index`, and its directory.
  Result<CreatedPath> create_path(uint32_t index);
  // `created` becomes file `index`, blank; refused when it is one of the others again.
  Status take_created(std::vector<OpenedFile>& opened, uint32_t index, CreatedPath created);
  // A new store (no file holds a superblock): creates the missing files and formats them all
  // (store_id_, layout_); returns each file's extent count and sets the first extent's offset.
  Result<std::vector<uint32_t>> format_new_store(std::vector<OpenedFile>& opened,
                                                 const StoreOpenPlan& plan, uint64_t& first_offset);
  // An existing store: its files as the plan checked them, the lost ones replaced where the plan
  // says (replace_lost_files); returns each file's extent count (the first file's for one left
  // out).
  Result<std::vector<uint32_t>> adopt_existing_store(std::vector<OpenedFile>& opened,
                                                     const StoreOpenPlan& plan);
  // The superblock of file `index` of this store (store_id_, layout_, fingerprint_, geometry_).
  Superblock superblock_of(uint32_t index, uint64_t extent_count, uint64_t first_offset) const;
  // Writes `sb` at the start of the file and syncs it.
  Status write_superblock(int fd, const std::string& path, const Superblock& sb);

  // Replacing a drive (nvme_store_replace.cpp). At open of an existing store, each file the plan
  // formats or creates is formatted as that file of the store; one whose format fails is left
  // out (opened without, out of service), with the reason, as are those the plan leaves out.
  // Fails only when a created file is one of the others again.
  Status replace_lost_files(std::vector<OpenedFile>& opened, const StoreOpenPlan& plan);
  Status start_workers();
  Status recover();
  void post(std::unique_ptr<Op> op);
  Result<ExtentLocation> place(uint32_t extent) const;
  // Under index_mu_: the ready entry of `key`, its extent's place written into `op` and the extent
  // counted as read (readers_), so it is not reused under the read; not_found or
  // failed_precondition, prefixed by `what`, when the block is absent or still being written.
  Result<const Entry*> claim_for_read(const BlockKey& key, const std::string& what, Op& op);

  // Called by the I/O threads when an operation ends (index_mu_ taken inside). write_finished
  // hands back the writes that joined `op`; the caller completes them, outside the lock, with
  // complete_joined once op's own transfer has completed.
  friend class Worker;
  std::vector<std::shared_ptr<TransferState>> write_finished(const Op& op, bool ok);
  static void complete_joined(std::vector<std::shared_ptr<TransferState>>& joined,
                              const BlockKey& key, const Status& result);
  void read_finished(const Op& op, bool ok);
  void drop_corrupt(const Op& op, const std::string& why);
  // A read of `op` failed with a media error: its extent is retired when it is let go.
  void blame_extent(const Op& op, const std::string& why);
  // `failed`, the failure of `op`, as the caller is told it: kUnavailable, naming the drive, when
  // op's file is out of service (this failure took it out, or came after): it says nothing more
  // of the disks left in service, and the scheduler's pauses must not count it.
  Status failed_on_a_dead_drive(const Op& op, const Status& failed);
  // Under index_mu_: `extent` is retired instead of freed when it is let go, unless the cap is
  // reached. `why` names the failed request.
  void mark_bad_locked(uint32_t extent, const std::string& why);
  // Under index_mu_: a request to `extent` of `file` failed with a media error: the extent is
  // marked bad, and the file may go out of service (take_file_out_locked).
  void note_media_error_locked(uint32_t extent, uint32_t file, const std::string& why);
  // Under index_mu_: retires the free extents of `file`, drops its blocks into lost_.
  void take_file_out_locked(uint32_t file, const std::string& why);
  // Under index_mu_: whether `extent` lies in a file taken out of service.
  bool on_a_file_out_of_service_locked(uint32_t extent) const;
  // Under index_mu_: frees `extent`, or retires it when it was marked bad or its file is out of
  // service.
  void free_extent_locked(uint32_t extent);

  // Hung drives (nvme_store_hung.cpp). A request of `op` passed the I/O timeout: counted against
  // its file (a media error for NvmeFileHealth), which refuses requests until it answers.
  void note_unanswered(const Op& op, const std::string& what);
  // That request was answered at last.
  void note_answered(const Op& op);
  // Under index_mu_: OK, or the error a new request to `file` fails with at once while the file
  // has requests unanswered (it counts against the file, as a request that timed out would).
  Status refuse_on_a_hung_drive_locked(uint32_t file, const std::string& what);
  // The same for an operation posted before its file stopped answering (takes index_mu_ only
  // while some request is unanswered).
  Status refuse_on_a_hung_drive(const Op& op);
  // The write `op` is abandoned: its key leaves the index (its extent stays reserved, as
  // draining, until the write ends); hands back the writes that joined it, to be told with it.
  std::vector<std::shared_ptr<TransferState>> abandon_write(const Op& op);
  // The drive answered an abandoned write at last: its extent is let go.
  void abandoned_write_ended(const Op& op, bool ok);

  // Readmission (nvme_store_readmit.cpp). Under index_mu_: posts a probe of each file out of
  // service whose probe is due (NvmeFileHealth::probes_due).
  void post_due_probes_locked();
  // The extents the file comes back with when the superblock probe `op` read is this store's, for
  // that file: its own count, or the store's count for it when that is smaller (a file opened
  // without at start was given the first file's count).
  Result<uint64_t> check_probe(const Op& op) const;
  // The I/O of probe `op` ended with `result`. A read that found this store's superblock goes on
  // as its write-back (post_write_back), one that found the file blank as a format
  // (post_format); a write, a failure or another superblock ends the probe (probe_finished).
  void probe_answered(const Op& op, const Status& result);
  // Posts the write of the superblock `probe` read, back in place: a drive must take writes to
  // be readmitted.
  // `extents`: what the file comes back with (check_probe).
  Status post_write_back(const Op& probe, uint64_t extents);
  // Posts the write of `superblock` (probe_bytes()) at the start of `probe`'s file, as the
  // probe's last step; `formats`: it is a new one, for a blank file; `extents`: what the file
  // comes back with once it lands.
  void post_probe_write(const Op& probe, AlignedBytes superblock, bool formats, uint64_t extents);
  // A buffer for a probe's superblock, as O_DIRECT wants it (null when out of memory), and its
  // size: whole aligned blocks.
  AlignedBytes new_probe_buffer() const;
  uint64_t probe_bytes() const;
  // The probe `op` ended with `result`: the file is back in service, or waits for the next.
  void probe_finished(const Op& op, const Status& result);
  // Under index_mu_; `formatted`: the probe wrote the superblock of a blank file (a replaced
  // drive), whose extents then come back with the old drive's bad-sector marks forgotten; on
  // success the first `extents` of the file's extents come back (those past them stay retired).
  void probe_finished_locked(uint32_t file, const Status& result, bool formatted, uint64_t extents);
  // Under index_mu_: the extents of `file` marked bad are no longer (they count toward the cap no
  // more).
  void forget_bad_marks_locked(uint32_t file);
  // Replacing a drive while the store runs (nvme_store_replace.cpp). Under index_mu_: opens the
  // path of `file` afresh, for its probe. One that names another file than the store holds (a
  // replaced drive's file system mounted there) takes its place; a missing one is created only
  // where may_create_lost_file allows. A block device is the probe's own (Op::adopt_fd), returned,
  // and the file's only once the probe readmits it; empty when the probe uses the file's.
  Result<SharedFd> reopen_for_probe_locked(uint32_t file);
  // Under index_mu_: `fd` becomes the descriptor of `file` for every operation made from now on;
  // the one it replaces closes when the last operation made with it ends.
  void adopt_locked(uint32_t file, SharedFd fd);
  // The probe read `probe` ended with `read`: whether it found the file blank (its superblock
  // region all zeros, or a regular file of no bytes).
  bool found_blank(const Op& probe, const Status& read) const;
  // Posts the write of the superblock of the file `probe` found blank, as that file of the store
  // (after allocating a regular one to size), with the extents its place has, or those a smaller
  // block device holds; an error when it cannot hold one.
  Status post_format(const Op& probe);

  const PageFormat format_;
  const Geometry geometry_;  // format_.stored_geometry()
  NvmeStoreOptions options_;
  std::shared_ptr<TransferStats> stats_;
  ExtentLayout layout_;
  uint64_t fingerprint_ = 0;
  uint64_t store_id_ = 0;
  bool direct_io_ = true;
  // Per file: it held this store's superblock at open, so the index is rebuilt from its extent
  // headers (a new store's files, and those formatted or left out at open, are not read).
  std::vector<uint8_t> scan_at_open_;
  std::vector<File> files_;
  std::unique_ptr<ExtentAllocator> extents_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> next_worker_{0};

  mutable std::mutex index_mu_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index_;  // guarded by index_mu_
  std::vector<uint32_t> readers_;                            // per extent; guarded by index_mu_
  std::vector<uint8_t> doomed_;  // per extent: free when its readers reach 0; guarded by index_mu_
  std::vector<uint8_t> bad_;     // per extent: retire instead of freeing; guarded by index_mu_
  uint32_t bad_marked_ = 0;      // extents marked bad so far; guarded by index_mu_
  bool said_failing_whole_ = false;    // the cap was reached and logged; guarded by index_mu_
  NvmeFileHealth file_health_;         // guarded by index_mu_
  std::vector<uint32_t> unanswered_;   // per file: requests past the I/O timeout; index_mu_
  std::vector<BlockKey> lost_;         // dropped with their files, not yet taken; index_mu_
  std::atomic<bool> has_lost_{false};  // lost_ is not empty (written under index_mu_)
  uint64_t next_generation_ = 1;       // guarded by index_mu_
};

}  // namespace kvtier
