// kvtier configuration as plain structs.
//
// These structs are what the YAML loader (runtime/config_loader) fills, and what an embedder may
// fill in code instead. Every field has the default of configs/default.yaml, so a
// default-constructed Config is the embedded default. Sizes are bytes, durations are milliseconds,
// bandwidths are gigabytes (1e9 bytes) per second. Semantic checks (watermarks in (0,1], low <=
// high, capacities > 0, page size vs. direct I/O) live in runtime/config_validate so that
// code-built and YAML-built configs are held to the same rules. The README's configuration
// reference lists every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/types.hpp"

namespace kvtier {

// model: the KV geometry, plus the namespace that salts block keys.
struct ModelConfig {
  std::string name = "llama-3.1-8b";
  Geometry geometry;  // layers, kv_heads, head_dim, dtype, page_tokens
  // Salt of block keys: two deployments share cached KV only when their namespaces are equal.
  // Empty means "use `name`".
  std::string key_namespace;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Watermarks are fractions of capacity: above `high` the tier starts background demotion, which
// stops once usage falls to `low`.
struct Watermarks {
  double low = 0.85;
  double high = 0.95;

  friend bool operator==(const Watermarks&, const Watermarks&) = default;
};

enum class HbmBackend : uint8_t { kAuto = 0, kCuda = 1, kEmulated = 2 };

struct HbmTierConfig {
  uint64_t capacity_bytes = 1ull << 30;  // 1 GiB
  HbmBackend backend = HbmBackend::kAuto;
  int device = 0;  // CUDA device ordinal
  Watermarks watermarks;
  // Emulated backend only: throttle HBM<->host copies to this link bandwidth (GB/s); 0 =
  // unthrottled.
  double link_gbps = 0.0;

  friend bool operator==(const HbmTierConfig&, const HbmTierConfig&) = default;
};

// The dtype a tier below HBM stores pages in: as the model computes them, or fp8 e4m3 with
// per-page scales (half the bytes of bf16 on disk and over the link; lossy within e4m3's 2^-4
// relative step). See PageFormat in kvtier/types.hpp.
enum class TierKvDtype : uint8_t { kModel = 0, kFp8E4M3 = 1 };

// How a tier storing `kv_dtype` holds the pages of `model`.
inline PageFormat tier_page_format(const Geometry& model, TierKvDtype kv_dtype) {
  return kv_dtype == TierKvDtype::kFp8E4M3 ? PageFormat::fp8(model)
                                           : PageFormat::as_computed(model);
}

struct HostTierConfig {
  uint64_t capacity_bytes = 4ull << 30;  // 4 GiB
  int numa_node = -1;                    // -1 = auto (nearest the GPU when one is known)
  bool huge_pages = true;                // try 2 MiB pages first, fall back to 4 KiB
  bool lock_memory = true;               // mlock when permitted (no CUDA); cudaHostAlloc otherwise
  // fp8_e4m3: pages are quantized on the HBM->host copy and dequantized on the way back; the
  // NVMe tier below must then store fp8 too (it receives the host's pages as they are).
  TierKvDtype kv_dtype = TierKvDtype::kModel;
  Watermarks watermarks;

  friend bool operator==(const HostTierConfig&, const HostTierConfig&) = default;
};

enum class ChecksumKind : uint8_t { kXxh3 = 0, kCrc32c = 1 };

struct NvmeTierConfig {
  bool enabled = true;
  uint64_t capacity_bytes = 16ull << 30;  // 16 GiB, summed over all paths
  // Files (created 0600) or raw block devices; relative paths are relative to the working
  // directory. The loader expands "${KVTIER_CACHE_DIR}" in these paths to that environment
  // variable, or to
  // "./.kvtier" when it is unset: configs/default.yaml says "${KVTIER_CACHE_DIR}/store0.kvs".
  std::vector<std::string> paths = {"./.kvtier/store0.kvs"};
  uint32_t queue_depth = 64;
  uint32_t io_threads = 1;  // one io_uring ring per thread
  bool direct_io = true;    // O_DIRECT; page size a multiple of 512 bytes
  bool sqpoll = false;      // IORING_SETUP_SQPOLL
  ChecksumKind checksum = ChecksumKind::kXxh3;
  // fp8_e4m3: blocks are quantized as they are written and dequantized as they are read back.
  TierKvDtype kv_dtype = TierKvDtype::kModel;
  double read_gbps = 0.0;  // bandwidth for compute-or-load planning; 0 = measure/assume default
  double write_gbps = 0.0;
  Watermarks watermarks;
  // Failed writes in a row (none succeeding between) that pause writing to NVMe; 0 = never pause.
  // The first pause lasts pause_ms; each failure of the first writes after one doubles it, up to
  // 5 minutes (or pause_ms, when longer). Copies already there are still read.
  uint32_t pause_after_failed_writes = 8;
  // Failed reads in a row (I/O errors, bytes that fail their checksum) that pause reading from
  // NVMe, the same way: while paused, prompts reuse no block from NVMe (they recompute it) and
  // hints read none; the copies stay there for after the pause. 0 = never pause.
  uint32_t pause_after_failed_reads = 8;
  uint32_t pause_ms = 1000;
  // A request the drive has not answered after this long (a hung drive) counts as that drive's
  // failure: a write is told it failed (its memory and extent stay reserved until the drive
  // answers), and requests to that drive fail at once until it answers every one. Reads in
  // flight end when the drive answers (the kernel's own timeout bounds that). 0 = never.
  uint32_t io_timeout_ms = 5000;
  // With several paths (one per drive): failed or unanswered requests in a row to one file, none
  // succeeding between, that take it out of service until a probe readmits it (readmit_after_ms)
  // or the store is reopened (its blocks are dropped, no block lands there meanwhile). The last
  // file in service never leaves. 0 = never.
  uint32_t out_of_service_after_failures = 8;
  // A file taken out of service (or missing or unreadable when the store opened) is tried again
  // (its superblock read) this long after it went out, then after twice each wait before while
  // it keeps failing, up to 16 times this; a probe that succeeds puts it back in service, empty.
  // 0 = out until the store is reopened.
  uint32_t readmit_after_ms = 30'000;

  friend bool operator==(const NvmeTierConfig&, const NvmeTierConfig&) = default;
};

struct TiersConfig {
  HbmTierConfig hbm;
  HostTierConfig host;
  NvmeTierConfig nvme;

  // How the host tier holds the pages of `model` (what the HBM<->host links move).
  PageFormat host_page_format(const Geometry& model) const {
    return tier_page_format(model, host.kv_dtype);
  }
  // How the NVMe tier stores the pages of `model`.
  PageFormat nvme_page_format(const Geometry& model) const {
    return tier_page_format(model, nvme.kv_dtype);
  }

  friend bool operator==(const TiersConfig&, const TiersConfig&) = default;
};

enum class EvictionPolicy : uint8_t { kLru = 0, kLfu, kS3Fifo, kPrefixAware, kLookahead };
enum class WritePolicy : uint8_t { kWriteThrough = 0, kWriteBack, kWriteThroughSelective };
enum class LatePolicy : uint8_t { kStall = 0, kRecompute };

struct AdmissionConfig {
  // A block is written to NVMe only after it was hit at least this many times (0 = always).
  uint32_t nvme_min_hits = 0;

  friend bool operator==(const AdmissionConfig&, const AdmissionConfig&) = default;
};

struct PrefetchConfig {
  uint32_t depth = 16;         // how many queued requests (from hints) to prefetch ahead
  bool layerwise = true;       // load layer by layer so layer L computes while later layers load
  uint32_t layer_window = 4;   // layers loading ahead of the one computing, when HBM is short
  uint32_t deadline_ms = 200;  // longest a step waits for a page before `on_late` applies
  LatePolicy on_late = LatePolicy::kStall;

  friend bool operator==(const PrefetchConfig&, const PrefetchConfig&) = default;
};

struct PoliciesConfig {
  EvictionPolicy eviction = EvictionPolicy::kLru;
  WritePolicy write = WritePolicy::kWriteBack;
  uint32_t write_selective_hits = 2;  // write_through_selective: write through after N hits
  AdmissionConfig admission;
  PrefetchConfig prefetch;
  // Compute-or-load: the engine's prefill speed, used to refuse loads slower than recomputing.
  double prefill_tokens_per_s = 10000.0;
  // Fraction of HBM frames that prefixes pinned with Runtime::pin_prefix may hold, in (0, 1].
  double pin_quota = 0.25;

  friend bool operator==(const PoliciesConfig&, const PoliciesConfig&) = default;
};

struct MetricsConfig {
  std::string listen = "127.0.0.1:9464";  // "host:port"; empty = metrics off (YAML: "" or off)
  // Upper bounds (seconds) of the transfer-latency histogram buckets; strictly increasing, > 0.
  std::vector<double> latency_buckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                         0.01,   0.025,   0.05,   0.1,   0.25,   1.0};

  friend bool operator==(const MetricsConfig&, const MetricsConfig&) = default;
};

struct Config {
  ModelConfig model;
  TiersConfig tiers;
  PoliciesConfig policies;
  MetricsConfig metrics;

  friend bool operator==(const Config&, const Config&) = default;
};

}  // namespace kvtier
