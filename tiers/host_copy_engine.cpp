// HostCopyEngine: the copy engine of the emulated HBM tier (see copy_engine.hpp for the contract).
//
// One worker thread per direction plays the part of a CUDA stream: it takes jobs in seq order,
// waits for the other direction when a job depends on it, copies each segment with memcpy and
// completes the job. With link_gbps > 0 each direction is paced like a full-duplex link of that
// bandwidth: a segment of n bytes may finish no earlier than n / rate after the previous one
// (a token bucket with no burst), which is what PCIe transfers look like from the host. A job that
// re-encodes (fp8 host tier) runs the page codec on the worker instead of the copy, and is paced
// by the encoded bytes, which are what would cross the link.
// Lock: mu_ guards both queues and both watermarks; it is never held while copying or sleeping.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "tiers/copy_engine.hpp"
#include "tiers/page_codec.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace kvtier {
namespace {

// Copies one segment with non-temporal stores where it pays: the bytes go to the other tier and
// this CPU will not read them soon, so streaming them past the cache saves the read-for-ownership
// of every destination line and leaves the cache to the engine's callers. This is what glibc's
// memcpy does for one large copy, and what a page-by-page memcpy (each below glibc's threshold)
// would not do. Small or unaligned segments use memcpy. The caller fences before publishing.
constexpr std::size_t kStreamMin = 4096;

void copy_segment(void* dst, const void* src, std::size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamMin && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    auto* d = static_cast<__m128i*>(dst);
    const auto* s = static_cast<const __m128i*>(src);
    const std::size_t lines = n / 64;
    for (std::size_t i = 0; i < lines; ++i, d += 4, s += 4) {
      const __m128i a = _mm_load_si128(s);
      const __m128i b = _mm_load_si128(s + 1);
      const __m128i c = _mm_load_si128(s + 2);
      const __m128i e = _mm_load_si128(s + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
    const std::size_t done = lines * 64;
    if (done < n)
      std::memcpy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, n - done);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Orders the streaming stores before the completion that makes the bytes visible to others.
void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(const HostCopyOptions& options, std::shared_ptr<TransferStats> stats)
      : bytes_per_ns_(options.link_gbps > 0 ? options.link_gbps : 0.0), stats_(std::move(stats)) {}

  // Started outside the constructor: when a thread cannot be created (EAGAIN), the destructor
  // still runs and stops and joins the worker already started, rather than std::terminate.
  Status start() {
    for (int d = 0; d < 2; ++d) {
      try {
        workers_[d] = std::thread([this, d] { run(static_cast<CopyDirection>(d)); });
      } catch (const std::system_error& e) {
        return resource_exhausted("host copy engine: cannot start its " +
                                  std::string(link_name(copy_link(static_cast<CopyDirection>(d)))) +
                                  " worker thread: " + e.what());
      }
    }
    return Status();
  }

  ~HostCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

  std::string_view name() const override {
    return bytes_per_ns_ > 0 ? "host-memcpy (throttled)" : "host-memcpy";
  }

  Status submit(CopyJob job) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return cancelled("copy engine is shutting down");
      queues_[static_cast<int>(job.direction)].push_back(std::move(job));
    }
    cv_.notify_all();
    return Status();
  }

  uint64_t completed(CopyDirection d) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_[static_cast<int>(d)];
  }

 private:
  void run(CopyDirection dir) {
    const int d = static_cast<int>(dir);
    const int o = 1 - d;
    std::chrono::steady_clock::time_point link_free = std::chrono::steady_clock::now();
    while (true) {
      CopyJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Wait for a job whose dependency (if any) has completed. On shutdown the queues still
        // drain — the other worker finishes the dependency — so no handle waits forever.
        cv_.wait(lock, [&] {
          if (queues_[d].empty()) return stopping_;
          return queues_[d].front().after_other_seq <= completed_[o];
        });
        if (queues_[d].empty()) return;
        job = std::move(queues_[d].front());
        queues_[d].pop_front();
      }
      const bool cancel = job.state->cancel_requested();
      Status result;
      if (cancel) {
        result = cancelled("copy " + std::string(link_name(copy_link(dir))) +
                           " cancelled before it started");
      } else {
        for (const CopySegment& s : job.segments) {
          std::size_t moved = s.bytes;
          if (!job.host_format) {
            copy_segment(s.dst, s.src, s.bytes);
          } else if (dir == CopyDirection::kHbmToHost) {
            encode_page(*job.host_format, static_cast<const std::byte*>(s.src),
                        static_cast<std::byte*>(s.dst));
            moved = job.host_format->page_bytes();
          } else {
            decode_page(*job.host_format, static_cast<const std::byte*>(s.src),
                        static_cast<std::byte*>(s.dst));
            moved = job.host_format->page_bytes();
          }
          if (bytes_per_ns_ > 0) {
            const auto now = std::chrono::steady_clock::now();
            if (link_free < now) link_free = now;
            link_free += std::chrono::nanoseconds(
                static_cast<int64_t>(static_cast<double>(moved) / bytes_per_ns_));
            std::this_thread::sleep_until(link_free);
          }
        }
        store_fence();
        result = refused_pages_status(job);
        if (stats_) {
          stats_->copy_segments.fetch_add(job.segments.size(), std::memory_order_relaxed);
          stats_->copy_pages.fetch_add(job.pages, std::memory_order_relaxed);
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        completed_[d] = job.seq;
      }
      cv_.notify_all();
      job.state->complete(result);
      result.ignore();
    }
  }

  const double bytes_per_ns_;  // GB/s == bytes per ns
  const std::shared_ptr<TransferStats> stats_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CopyJob> queues_[2];   // guarded by mu_
  uint64_t completed_[2] = {0, 0};  // guarded by mu_
  bool stopping_ = false;           // guarded by mu_
  std::thread workers_[2];
};

}  // namespace

Result<std::unique_ptr<CopyEngine>> make_host_copy_engine(const HostCopyOptions& options,
                                                          std::shared_ptr<TransferStats> stats) {
  if (options.link_gbps < 0) {
    return invalid_argument("tiers.hbm.link_gbps must be >= 0 (got " +
                            std::to_string(options.link_gbps) + ")");
  }
  auto engine = std::make_unique<HostCopyEngine>(options, std::move(stats));
  KVTIER_RETURN_IF_ERROR(engine->start());
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

}  // namespace kvtier
