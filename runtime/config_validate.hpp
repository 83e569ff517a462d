// Semantic rules of a Config, the same for a Config read from YAML and one filled in code.
//
// The loader checks types and spellings as it reads (it knows file:line:col); these rules check
// what only the whole Config can tell: ranges, watermarks, sizes against the geometry, O_DIRECT
// alignment. Each problem is a ConfigIssue naming the key paths that decide it, so the loader can
// point at whichever of them the user actually wrote (e.g. the `model.head_dim` line of a file
// that made the page size unfit for direct I/O). Pure functions; safe from any thread.
//
// Bounds (the README's configuration reference lists the same):
//   model.layers 1..1024, model.kv_heads 1..1024, model.head_dim a multiple of 8 in 8..1024
//   (16-byte vector loads at bf16), model.page_tokens 1..1024, a block (all layers of a page) at
//   most 1 GiB; every enabled tier holds at least one frame/extent and at most 2^32-2;
//   watermarks 0 < low <= high <= 1; nvme paths non-empty, distinct, queue_depth 1..4096,
//   io_threads 1..64, page bytes a multiple of 512 when direct_io; bandwidths finite and >= 0;
//   prefetch.layer_window >= 1, deadline_ms >= 1; write_selective_hits >= 1; prefill_tokens_per_s
//   > 0; pin_quota in (0, 1]; metrics.listen empty or host:port / [v6]:port as the exporter
//   parses it (port 0..65535); latency buckets 1..64 of them, finite, > 0 and strictly increasing.
#pragma once

#include <string>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier {

inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxKvHeads = 1024;
inline constexpr uint32_t kMaxHeadDim = 1024;
inline constexpr uint32_t kHeadDimMultiple = 8;
inline constexpr uint32_t kMaxPageTokens = 1024;
inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 30;
inline constexpr uint64_t kDirectIoAlignment = 512;
inline constexpr uint32_t kMaxQueueDepth = 4096;
inline constexpr uint32_t kMaxIoThreads = 64;
inline constexpr uint32_t kMaxNvmePauseMs = 3'600'000;         // an hour
inline constexpr uint32_t kMaxNvmeIoTimeoutMs = 600'000;       // ten minutes
inline constexpr uint32_t kMaxNvmeReadmitAfterMs = 3'600'000;  // an hour
inline constexpr int kMaxCudaDevice = 255;
inline constexpr int kMaxNumaNode = 1023;
inline constexpr std::size_t kMaxLatencyBuckets = 64;

struct ConfigIssue {
  // The key the rule is about first, then other keys that also decide it. Never empty.
  std::vector<std::string> keys;
  std::string message;
};

// Every problem, section by section (model, tiers, policies, metrics); empty when valid.
std::vector<ConfigIssue> find_config_issues(const Config& config);

// OK, or kInvalidArgument listing every problem as "key.path: message", joined by "; ".
Status validate_config(const Config& config);

}  // namespace kvtier
