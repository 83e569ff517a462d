// The compared configurations. See baseline.hpp.
#include "bench/run/baseline.hpp"

#include <array>

#include "runtime/config_suggest.hpp"

namespace kvtier::bench::run {
namespace {

constexpr std::array<BaselineKind, 4> kAll = {BaselineKind::kRecompute, BaselineKind::kHbmLru,
                                              BaselineKind::kHbmHost, BaselineKind::kKvtier};

BaselineSpec make(BaselineKind kind, const PoliciesConfig& configured, double prefill) {
  BaselineSpec b;
  b.kind = kind;
  b.name = std::string(baseline_name(kind));
  // What the engine-side caches do: LRU, evicted blocks written down, no lookahead.
  PoliciesConfig plain;
  plain.eviction = EvictionPolicy::kLru;
  plain.write = WritePolicy::kWriteBack;
  plain.prefetch.depth = 0;
  plain.prefetch.on_late = LatePolicy::kStall;
  switch (kind) {
    case BaselineKind::kRecompute:
      b.summary = "no reuse: every prompt computed in full (HBM only)";
      b.reuse = false;
      b.host = b.nvme = b.hints = false;
      b.policies = plain;
      break;
    case BaselineKind::kHbmLru:
      b.summary = "HBM-only prefix cache, LRU";
      b.host = b.nvme = b.hints = false;
      b.policies = plain;
      break;
    case BaselineKind::kHbmHost:
      b.summary = "HBM + host memory, LRU, evictions demoted to host, no hints";
      b.nvme = b.hints = false;
      b.policies = plain;
      break;
    case BaselineKind::kKvtier:
      b.summary = "HBM + host + NVMe, configured policies, waiting queue hinted";
      b.policies = configured;
      break;
  }
  b.policies.prefill_tokens_per_s = prefill;
  return b;
}

}  // namespace

std::string_view baseline_name(BaselineKind kind) {
  switch (kind) {
    case BaselineKind::kRecompute: return "recompute";
    case BaselineKind::kHbmLru: return "hbm_lru";
    case BaselineKind::kHbmHost: return "hbm_host";
    case BaselineKind::kKvtier: return "kvtier";
  }
  return "unknown";
}

Result<std::vector<BaselineSpec>> make_baselines(std::string_view names,
                                                 const PoliciesConfig& configured,
                                                 double prefill_tokens_per_s) {
  std::vector<BaselineSpec> out;
  if (names.empty() || names == "all") {
    for (BaselineKind k : kAll) out.push_back(make(k, configured, prefill_tokens_per_s));
    return out;
  }
  std::vector<std::string_view> known;
  for (BaselineKind k : kAll) known.push_back(baseline_name(k));
  std::size_t pos = 0;
  while (pos <= names.size()) {
    std::size_t end = names.find(',', pos);
    if (end == std::string_view::npos) end = names.size();
    const std::string_view name = names.substr(pos, end - pos);
    pos = end + 1;
    if (name.empty()) continue;
    bool found = false;
    for (BaselineKind k : kAll) {
      if (baseline_name(k) != name) continue;
      found = true;
      bool dup = false;
      for (const BaselineSpec& b : out) dup = dup || b.kind == k;
      if (!dup) out.push_back(make(k, configured, prefill_tokens_per_s));
    }
    if (!found) {
      std::string msg =
          "no baseline named \"" + std::string(name) + "\" (known: " + join_words(known) + ")";
      if (auto near = closest_match(name, known))
        msg += "; did you mean " + std::string(*near) + "?";
      return invalid_argument(msg);
    }
  }
  if (out.empty()) return invalid_argument("--baselines names none");
  return out;
}

}  // namespace kvtier::bench::run
