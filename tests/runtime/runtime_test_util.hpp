// Helpers for Runtime tests: a small configuration over emulated HBM, a host pool and an NVMe store
// in a temporary directory, and a stand-in engine that writes deterministic K/V bytes into the
// frames it is given and checks them when it reads them back; an auditor thread that checks the
// runtime's invariants while engine threads call it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.hpp"
#include "runtime/runtime_opener.hpp"

namespace kvtier::testing {

// A fresh directory under the build tree (or $TMPDIR), removed by the destructor.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view name) {
    const char* base = std::getenv("TMPDIR");
    std::filesystem::path root = base != nullptr ? base : "/tmp";
    std::random_device rd;
    path_ = root / (std::string("kvtier-") + std::string(name) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline Config small_config(const std::filesystem::path& dir) {
  Config c;
  c.model.name = "test-model";
  c.model.geometry = Geometry{/*layers=*/4, /*kv_heads=*/2, /*head_dim=*/64, Dtype::kBF16,
                              /*page_tokens=*/16};  // 8 KiB pages
  c.tiers.hbm.backend = HbmBackend::kEmulated;
  c.tiers.hbm.capacity_bytes = 64 * 8192;    // 64 frames
  c.tiers.host.capacity_bytes = 256 * 8192;  // 256 frames
  c.tiers.host.huge_pages = false;
  c.tiers.host.lock_memory = false;
  c.tiers.nvme.capacity_bytes = 16ull << 20;
  c.tiers.nvme.paths = {(dir / "store0.kvs").string()};
  c.tiers.nvme.queue_depth = 16;
  c.metrics.listen = "";
  return c;
}

// The runtime of `c` (over the tier seams given, e.g. a fault-injecting I/O backend), or null:
// when its NVMe store cannot be opened here (kUnavailable: O_DIRECT or io_uring refused) the
// caller skips the test; any other failure fails it.
inline std::unique_ptr<Runtime> open_or_skip(const Config& c, TierStackOptions seams = {},
                                             const RuntimeOptions& options = {}) {
  auto rt = detail::RuntimeOpener::open(c, options, std::move(seams));
  if (!rt.ok() && rt.status().code() == StatusCode::kUnavailable) return nullptr;
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

// The K/V bytes a token contributes to a page, as a function of its content and position only, so
// that two sequences sharing a prefix produce identical pages (which is what makes reuse valid).
inline uint8_t kv_byte(uint32_t token, uint64_t position, uint32_t layer, bool value,
                       std::size_t i) {
  uint64_t x = (static_cast<uint64_t>(token) << 32) ^ (position * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(layer) << 56) ^ (value ? 0xABCDull : 0) ^ (i * 0x2545F491ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

// Writes tokens [first, first + count) of a sequence (`tokens` holds all of them) into the pages of
// `layer` listed in `table` for batch item `item`.
inline void write_tokens(const HbmView& view, const Geometry& g, const LayerTable& table,
                         std::size_t item, uint32_t layer, const std::vector<uint32_t>& tokens,
                         uint64_t first, uint64_t count) {
  const std::size_t tb = g.token_bytes();
  for (uint64_t pos = first; pos < first + count; ++pos) {
    const int32_t frame = table.indices[table.indptr[item] + pos / g.page_tokens];
    auto* page =
        static_cast<uint8_t*>(view.base) + static_cast<std::size_t>(frame) * view.frame_stride;
    const std::size_t slot = pos % g.page_tokens;
    for (std::size_t i = 0; i < tb; ++i) {
      page[slot * tb + i] = kv_byte(tokens[pos], pos, layer, false, i);
      page[(g.page_tokens + slot) * tb + i] = kv_byte(tokens[pos], pos, layer, true, i);
    }
  }
}

// Checks every token [0, count) of batch item `item` in `layer` against kv_byte; returns the first
// mismatching position, or -1.
inline int64_t check_tokens(const HbmView& view, const Geometry& g, const LayerTable& table,
                            std::size_t item, uint32_t layer, const std::vector<uint32_t>& tokens,
                            uint64_t count) {
  const std::size_t tb = g.token_bytes();
  for (uint64_t pos = 0; pos < count; ++pos) {
    const int32_t frame = table.indices[table.indptr[item] + pos / g.page_tokens];
    const auto* page = static_cast<const uint8_t*>(view.base) +
                       static_cast<std::size_t>(frame) * view.frame_stride;
    const std::size_t slot = pos % g.page_tokens;
    for (std::size_t i = 0; i < tb; ++i) {
      if (page[slot * tb + i] != kv_byte(tokens[pos], pos, layer, false, i) ||
          page[(g.page_tokens + slot) * tb + i] != kv_byte(tokens[pos], pos, layer, true, i)) {
        return static_cast<int64_t>(pos);
      }
    }
  }
  return -1;
}

inline std::vector<uint32_t> make_tokens(std::size_t n, uint32_t seed, std::size_t shared = 0) {
  std::vector<uint32_t> t(n);
  std::mt19937 rng(seed);
  std::mt19937 shared_rng(424242);
  for (std::size_t i = 0; i < n; ++i) t[i] = i < shared ? shared_rng() % 32000 : rng() % 32000;
  return t;
}

// Runs one step for one sequence: waits for each layer, checks the context already there, writes
// the new tokens, ends the layer. Returns the step's status. `tokens` holds the context and the
// new tokens, context + new_tokens in all. A step that gives tokens back to recompute (a block
// lost to a failed NVMe read) checks the context up to, and writes from, its context_tokens.
inline Status run_checked_step(Runtime& rt, SequenceId seq, const std::vector<uint32_t>& tokens,
                               uint64_t context, uint32_t new_tokens, bool* bytes_ok) {
  if (tokens.size() < context + new_tokens) {
    return invalid_argument("run_checked_step: " + std::to_string(tokens.size()) +
                            " tokens, but the step reaches position " +
                            std::to_string(context + new_tokens));
  }
  const StepItem item{seq, new_tokens};
  auto step = rt.begin_step(std::span(&item, 1));
  if (!step.ok()) return step.status();
  const StepItemInfo& info = step->items[0];
  const uint32_t writes = info.recomputed_tokens + info.new_tokens;
  if (info.context_tokens + writes != context + new_tokens) {
    rt.abort_step(step->id).ignore();
    return internal_error("run_checked_step: the step writes tokens [" +
                          std::to_string(info.context_tokens) + ", " +
                          std::to_string(info.context_tokens + writes) + "), not up to " +
                          std::to_string(context + new_tokens));
  }
  context = info.context_tokens;
  new_tokens = writes;
  const HbmView view = rt.hbm_view();
  const Geometry& g = rt.geometry();
  for (uint32_t l = 0; l < step->layers; ++l) {
    Status w = rt.wait_layer(step->id, l);
    if (!w.ok()) {
      rt.abort_step(step->id).ignore();
      return w;
    }
    auto table = rt.layer_table(step->id, l);
    if (!table.ok()) return table.status();
    if (check_tokens(view, g, *table, 0, l, tokens, context) >= 0) *bytes_ok = false;
    write_tokens(view, g, *table, 0, l, tokens, context, new_tokens);
    Status e = rt.end_layer(step->id, l);
    if (!e.ok()) return e;
  }
  return rt.end_step(step->id);
}

// Calls Runtime::audit over and over on a thread of its own, from construction to stop(), so
// the invariants are checked between whichever two loop decisions the engine threads leave it.
// stop() joins and returns "" or the first failure, with how many audits passed before it.
class Auditor {
 public:
  explicit Auditor(Runtime& rt)
      : thread_([this, &rt] {
          while (!stopping_.load()) {
            Status s = rt.audit();
            if (!s.ok()) {
              broken_ = s.to_string() + " (after " + std::to_string(passed_) + " audits passed)";
              return;
            }
            ++passed_;
          }
        }) {}
  ~Auditor() { stop(); }
  Auditor(const Auditor&) = delete;
  Auditor& operator=(const Auditor&) = delete;

  std::string stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
    return broken_;
  }
  uint64_t passed() const { return passed_.load(); }

 private:
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> passed_{0};
  std::string broken_;  // written by the thread, read after join
  std::thread thread_;  // last: starts once the fields above exist
};

}  // namespace kvtier::testing
