// Shared helpers for the tiers tests: temporary store directories, page patterns, small
// geometries, and test doubles for the device and host-memory seams.
//
// FakeDevice runs the CUDA code paths on the CPU with CUDA's ordering rules: device and pinned
// memory are host allocations; each stream is a thread executing its queue in order; an event
// completes when the stream reaches the point where it was recorded; stream_wait_event makes a
// stream wait for that point. Knobs fail allocations above a size, fail the k-th copy, or slow
// device-to-host copies so a missing cross-stream dependency would show up as wrong data, or fail
// the next event creations or recordings.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/types.hpp"
#include "tiers/device_api.hpp"
#include "tiers/host_memory_api.hpp"
#include "tiers/page_codec.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kvtier-tiers-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A small geometry: `layers` pages of page_tokens * kv_heads * head_dim elements per half.
inline Geometry small_geometry(Dtype dtype = Dtype::kBF16, uint32_t layers = 4,
                               uint32_t page_tokens = 16, uint32_t kv_heads = 2,
                               uint32_t head_dim = 64) {
  Geometry g;
  g.layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.dtype = dtype;
  g.page_tokens = page_tokens;
  return g;
}

// A page shape for tests parameterized over dtypes and page sizes, and their test-name suffix.
struct PageShape {
  uint32_t page_tokens;
  uint32_t kv_heads;
  uint32_t head_dim;
};

inline std::string dtype_shape_name(
    const ::testing::TestParamInfo<std::tuple<Dtype, PageShape>>& info) {
  const auto& [dtype, shape] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(shape.page_tokens) + "x" +
         std::to_string(shape.kv_heads) + "x" + std::to_string(shape.head_dim);
}

// Deterministic page contents: every byte depends on (seed, index).
inline void fill_pattern(std::byte* dst, std::size_t bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (std::size_t i = 0; i < bytes; ++i) {
    if (i % 8 == 0) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
    }
    dst[i] = static_cast<std::byte>((x * 0x2545F4914F6CDD1Dull) >> (8 * (i % 8)));
  }
}

inline bool matches_pattern(const std::byte* src, std::size_t bytes, uint64_t seed) {
  std::vector<std::byte> expect(bytes);
  fill_pattern(expect.data(), bytes, seed);
  return std::memcmp(expect.data(), src, bytes) == 0;
}

inline BlockKey test_key(uint64_t i) {
  return BlockKey{0x1000 + i * 7919, (uint64_t{0x5A5A} << 48) | i};
}

// `count` page buffers of `page_io_bytes` (rounded up to 4096), each 4096-aligned.
class AlignedPages {
 public:
  AlignedPages(std::size_t count, std::size_t page_io_bytes)
      : stride_((page_io_bytes + 4095) / 4096 * 4096),
        bytes_(
            static_cast<std::byte*>(std::aligned_alloc(4096, stride_ * (count == 0 ? 1 : count)))) {
    std::memset(bytes_.get(), 0, stride_ * count);
    for (std::size_t i = 0; i < count; ++i) pages_.push_back(bytes_.get() + i * stride_);
  }
  std::byte* operator[](std::size_t i) const { return pages_[i]; }
  const std::vector<std::byte*>& pages() const { return pages_; }
  std::vector<const std::byte*> const_pages() const {
    return std::vector<const std::byte*>(pages_.begin(), pages_.end());
  }
  std::size_t size() const { return pages_.size(); }
  std::byte* base() const { return bytes_.get(); }
  std::size_t total_bytes() const { return stride_ * pages_.size(); }
  void fill(uint64_t seed, std::size_t page_bytes) {
    for (std::size_t i = 0; i < pages_.size(); ++i)
      fill_pattern(pages_[i], page_bytes, seed * 1000 + i);
  }
  bool matches(uint64_t seed, std::size_t page_bytes) const {
    for (std::size_t i = 0; i < pages_.size(); ++i) {
      if (!matches_pattern(pages_[i], page_bytes, seed * 1000 + i)) return false;
    }
    return true;
  }
  void scribble() { std::memset(bytes_.get(), 0xEE, stride_ * pages_.size()); }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t stride_;
  std::unique_ptr<std::byte, Free> bytes_;
  std::vector<std::byte*> pages_;
};

// --- Host memory that refuses on demand -------------------------------------------------------

class ScriptedHostMemory final : public HostMemoryApi {
 public:
  bool refuse_huge = false;
  bool refuse_lock = false;
  std::size_t max_map_bytes = SIZE_MAX;  // mmap larger than this fails with ENOMEM
  int nodes = 1;
  std::vector<int> node_ids;  // the nodes' OS indices when sparse (then `nodes` is ignored)
  int maps = 0;
  int locks = 0;

  Result<void*> map(std::size_t bytes, bool huge_2m) override {
    ++maps;
    if (huge_2m && refuse_huge) return resource_exhausted("mmap with 2 MiB pages: ENOMEM (test)");
    if (bytes > max_map_bytes) return resource_exhausted("mmap: ENOMEM (test)");
    return real_->map(bytes, false);
  }
  void unmap(void* addr, std::size_t bytes) noexcept override { real_->unmap(addr, bytes); }
  Status lock(void* addr, std::size_t bytes) override {
    ++locks;
    if (refuse_lock) return unavailable("mlock: Operation not permitted (test)");
    return Status();  // pretend: the test does not need the pages pinned
  }
  void unlock(void*, std::size_t) noexcept override {}
  Status advise_huge(void*, std::size_t) override { return Status(); }
  int numa_nodes() override { return node_ids.empty() ? nodes : static_cast<int>(node_ids.size()); }
  std::vector<int> numa_node_ids() override {
    return node_ids.empty() ? HostMemoryApi::numa_node_ids() : node_ids;
  }
  Result<int> numa_node_of_pci(const std::string&) override { return 0; }
  Status bind_area(void*, std::size_t, int node) override {
    const std::vector<int> ids = numa_node_ids();
    if (std::find(ids.begin(), ids.end(), node) == ids.end()) {
      return invalid_argument("no such node");
    }
    return Status();
  }
  Status bind_thread(int) override { return Status(); }
  void unbind_thread() noexcept override {}

 private:
  std::shared_ptr<HostMemoryApi> real_ = system_host_memory();
};

// --- A CUDA runtime on the CPU ----------------------------------------------------------------

class FakeDevice final : public DeviceApi, public std::enable_shared_from_this<FakeDevice> {
 public:
  std::size_t max_device_alloc = SIZE_MAX;  // larger cudaMalloc fails: out of memory
  bool refuse_pinned = false;
  int fail_copy_call = 0;                  // the nth copy_async call (1-based) fails; 0 = never
  int d2h_delay_ms = 0;                    // each device-to-host copy sleeps first
  int h2d_delay_ms = 0;                    // each host-to-device copy sleeps first
  std::atomic<int> fail_event_creates{0};  // the next n create_event calls fail
  std::atomic<int> fail_event_records{0};  // the next n record_event calls fail
  std::atomic<int> copy_calls{0};
  std::atomic<int> copy_segments{0};

  ~FakeDevice() override {
    for (auto& [id, s] : streams_) s->stop();
  }

  std::string_view name() const override { return "fake-cuda"; }
  int device() const override { return 0; }

  Result<void*> allocate_device(std::size_t bytes) override {
    if (bytes > max_device_alloc) return resource_exhausted("cudaMalloc: out of memory (fake)");
    return aligned(bytes);
  }
  void free_device(void* p) noexcept override { std::free(p); }
  Result<void*> allocate_pinned(std::size_t bytes) override {
    if (refuse_pinned) return resource_exhausted("cudaHostAlloc: out of memory (fake)");
    return aligned(bytes);
  }
  void free_pinned(void* p) noexcept override { std::free(p); }
  Result<std::string> pci_bus_id() override { return std::string("0000:00:00.0"); }

  Result<StreamHandle> create_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = std::make_unique<Stream>();
    void* id = s.get();
    streams_.emplace(id, std::move(s));
    return StreamHandle{id};
  }
  void destroy_stream(StreamHandle h) noexcept override {
    std::unique_ptr<Stream> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = streams_.find(h.raw);
      if (it == streams_.end()) return;
      s = std::move(it->second);
      streams_.erase(it);
    }
    s->stop();
  }
  Result<EventHandle> create_event() override {
    if (take(fail_event_creates)) {
      return resource_exhausted("cudaEventCreate: out of memory (fake)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto e = std::make_shared<Event>();
    void* id = e.get();
    events_.emplace(id, std::move(e));
    return EventHandle{id};
  }
  void destroy_event(EventHandle h) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.erase(h.raw);
  }
  Status record_event(EventHandle e, StreamHandle s) override {
    if (take(fail_event_records)) {
      return io_error("cudaEventRecord: unspecified launch failure (fake)");
    }
    auto ev = event(e);
    if (!ev) return invalid_argument("unknown event");
    const uint64_t gen = ev->record();
    stream(s)->push([ev, gen] { ev->reach(gen); });
    return Status();
  }
  Status stream_wait_event(StreamHandle s, EventHandle e) override {
    auto ev = event(e);
    if (!ev) return invalid_argument("unknown event");
    const uint64_t gen = ev->recorded();
    stream(s)->push([ev, gen] { ev->wait(gen); });
    return Status();
  }
  Status synchronize_event(EventHandle e) override {
    auto ev = event(e);
    if (!ev) return invalid_argument("unknown event");
    ev->wait(ev->recorded());
    return Status();
  }
  Status synchronize_stream(StreamHandle s) override {
    auto ev = std::make_shared<Event>();
    const uint64_t gen = ev->record();
    stream(s)->push([ev, gen] { ev->reach(gen); });
    ev->wait(gen);
    return Status();
  }
  Status copy_async(std::span<const CopySegment> segments, CopyKind kind, StreamHandle s) override {
    const int call = ++copy_calls;
    if (fail_copy_call != 0 && call == fail_copy_call) {
      return io_error("cudaMemcpyBatchAsync: an illegal memory access was encountered (fake)");
    }
    copy_segments += static_cast<int>(segments.size());
    std::vector<CopySegment> copy(segments.begin(), segments.end());
    const int delay = kind == CopyKind::kDeviceToHost ? d2h_delay_ms : h2d_delay_ms;
    stream(s)->push([copy = std::move(copy), delay] {
      if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      for (const CopySegment& c : copy) std::memcpy(c.dst, c.src, c.bytes);
    });
    return Status();
  }
  // The codec kernels, run on the CPU in stream order (the fake's device memory is host memory).
  Status encode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                            StreamHandle s) override {
    return run_codec(pages, format, s, true);
  }
  Status decode_pages_async(std::span<const CopySegment> pages, const PageFormat& format,
                            StreamHandle s) override {
    return run_codec(pages, format, s, false);
  }
  std::atomic<int> codec_calls{0};

 private:
  Status run_codec(std::span<const CopySegment> pages, const PageFormat& format, StreamHandle s,
                   bool encode) {
    ++codec_calls;
    std::vector<CopySegment> copy(pages.begin(), pages.end());
    stream(s)->push([copy = std::move(copy), format, encode] {
      for (const CopySegment& c : copy) {
        if (encode) {
          encode_page(format, static_cast<const std::byte*>(c.src), static_cast<std::byte*>(c.dst));
        } else {
          decode_page(format, static_cast<const std::byte*>(c.src), static_cast<std::byte*>(c.dst));
        }
      }
    });
    return Status();
  }

  // Consumes one of `n` armed failures; false when none is left.
  static bool take(std::atomic<int>& n) {
    int v = n.load();
    while (v > 0 && !n.compare_exchange_weak(v, v - 1)) {
    }
    return v > 0;
  }

  static void* aligned(std::size_t bytes) {
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  }

  class Event {
   public:
    uint64_t record() {
      std::lock_guard<std::mutex> lock(mu_);
      return ++recorded_;
    }
    uint64_t recorded() {
      std::lock_guard<std::mutex> lock(mu_);
      return recorded_;
    }
    void reach(uint64_t gen) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (gen > reached_) reached_ = gen;
      }
      cv_.notify_all();
    }
    void wait(uint64_t gen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return reached_ >= gen; });
    }

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t recorded_ = 0;
    uint64_t reached_ = 0;
  };

  class Stream {
   public:
    Stream() : thread_([this] { run(); }) {}
    void push(std::function<void()> task) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        tasks_.push_back(std::move(task));
      }
      cv_.notify_all();
    }
    void stop() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        stopping_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }

   private:
    void run() {
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return !tasks_.empty() || stopping_; });
          if (tasks_.empty()) return;
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    bool stopping_ = false;
    std::thread thread_;
  };

  std::shared_ptr<Event> event(EventHandle e) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(e.raw);
    return it == events_.end() ? nullptr : it->second;
  }
  Stream* stream(StreamHandle s) {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_.at(s.raw).get();
  }

  std::mutex mu_;
  std::map<void*, std::unique_ptr<Stream>> streams_;
  std::map<void*, std::shared_ptr<Event>> events_;
};

// Overwrites the first `frames` HBM and host frames, so what is read next can only come from NVMe.
inline void forget_memory_tiers(TierStack& s, uint32_t frames) {
  for (uint32_t f = 0; f < frames; ++f) {
    std::memset(s.host->frame_address(f), 0xA5, s.host->frame_bytes());
    std::memset(s.hbm->frame_address(f), 0x5A, s.hbm->frame_bytes());
  }
}

// Reads block `key` from NVMe into host frames `host_frames` (one per layer), then copies layer l
// up into HBM frame first_hbm + l; the first error of either step.
inline Status read_block_into_hbm(TierStack& s, const BlockKey& key,
                                  const std::vector<uint32_t>& host_frames, uint32_t first_hbm) {
  KVTIER_ASSIGN_OR_RETURN(Transfer read, s.engine->read_block(key, host_frames));
  KVTIER_RETURN_IF_ERROR(read.wait());
  std::vector<FramePair> up;
  for (uint32_t l = 0; l < host_frames.size(); ++l) up.push_back({host_frames[l], first_hbm + l});
  KVTIER_ASSIGN_OR_RETURN(Transfer copy, s.engine->copy(CopyDirection::kHostToHbm, up));
  return copy.wait();
}

// Polls `done` every millisecond for up to 10 s (a drive's answers reach the I/O thread within a
// few ms, timeouts and probes within their configured wait plus a wake-up).
template <typename F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace kvtier::testing
