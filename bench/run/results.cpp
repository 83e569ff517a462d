// Summaries of a baseline's run. See results.hpp.
#include "bench/run/results.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kvtier::bench::run {
namespace {

double nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const std::size_t rank =
      static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

double ms(Nanos ns) { return static_cast<double>(ns) * 1e-6; }

bool served(const RequestRecord& r) { return !r.rejected && r.finish >= 0; }

// TTFT of the served requests `keep` accepts.
template <typename Keep>
LatencySummary ttft_of(const std::vector<RequestRecord>& records, Keep keep) {
  std::vector<double> v;
  for (const RequestRecord& r : records) {
    if (served(r) && keep(r)) v.push_back(ms(r.first_token - r.arrival));
  }
  return summarize(std::move(v));
}

}  // namespace

LatencySummary summarize(std::vector<double> v) {
  LatencySummary s;
  s.count = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.p50 = nearest_rank(v, 0.50);
  s.p90 = nearest_rank(v, 0.90);
  s.p99 = nearest_rank(v, 0.99);
  s.max = v.back();
  return s;
}

uint64_t BaselineResult::completed() const {
  return static_cast<uint64_t>(std::count_if(records.begin(), records.end(), served));
}

uint64_t BaselineResult::rejected() const {
  return static_cast<uint64_t>(std::count_if(records.begin(), records.end(),
                                             [](const RequestRecord& r) { return r.rejected; }));
}

double BaselineResult::duration_s() const {
  Nanos first = -1;
  Nanos last = -1;
  for (const RequestRecord& r : records) {
    if (!served(r)) continue;
    first = first < 0 ? r.arrival : std::min(first, r.arrival);
    last = std::max(last, r.finish);
  }
  return first < 0 ? 0.0 : nanos_to_seconds(last - first);
}

LatencySummary BaselineResult::ttft_ms() const {
  return ttft_of(records, [](const RequestRecord&) { return true; });
}

LatencySummary BaselineResult::ttft_ms(uint32_t kind) const {
  return ttft_of(records, [kind](const RequestRecord& r) { return r.kind == kind; });
}

LatencySummary BaselineResult::tpot_ms() const {
  std::vector<double> v;
  for (const RequestRecord& r : records) {
    if (served(r) && r.output_tokens > 1) {
      v.push_back(ms(r.finish - r.first_token) / static_cast<double>(r.output_tokens - 1));
    }
  }
  return summarize(std::move(v));
}

LatencySummary BaselineResult::e2e_ms() const {
  std::vector<double> v;
  for (const RequestRecord& r : records) {
    if (served(r)) v.push_back(ms(r.finish - r.arrival));
  }
  return summarize(std::move(v));
}

uint64_t BaselineResult::input_tokens() const {
  uint64_t t = 0;
  for (const RequestRecord& r : records) {
    if (served(r)) t += r.input_tokens;
  }
  return t;
}

uint64_t BaselineResult::output_tokens() const {
  uint64_t t = 0;
  for (const RequestRecord& r : records) {
    if (served(r)) t += r.output_tokens;
  }
  return t;
}

uint64_t BaselineResult::hit_tokens(Tier tier) const {
  uint64_t t = 0;
  for (const RequestRecord& r : records) {
    if (served(r)) t += r.reused_tokens[tier_index(tier)];
  }
  return t;
}

double BaselineResult::hit_rate(Tier tier) const {
  const uint64_t in = input_tokens();
  return in == 0 ? 0.0 : static_cast<double>(hit_tokens(tier)) / static_cast<double>(in);
}

double BaselineResult::hit_rate() const {
  double h = 0;
  for (Tier t : kAllTiers) h += hit_rate(t);
  return h;
}

double BaselineResult::requests_per_s() const {
  const double d = duration_s();
  return d <= 0 ? 0.0 : static_cast<double>(completed()) / d;
}

double BaselineResult::output_tokens_per_s() const {
  const double d = duration_s();
  return d <= 0 ? 0.0 : static_cast<double>(output_tokens()) / d;
}

double BaselineResult::total_tokens_per_s() const {
  const double d = duration_s();
  return d <= 0 ? 0.0 : static_cast<double>(output_tokens() + input_tokens()) / d;
}

double BaselineResult::stall_fraction() const {
  const Nanos total = stall_ns + compute_ns;
  return total <= 0 ? 0.0 : static_cast<double>(stall_ns) / static_cast<double>(total);
}

double BaselineResult::hinted_reuse(Tier tier) const {
  const uint64_t loads = hinted_loads[tier_index(tier)];
  if (loads == 0) return std::numeric_limits<double>::quiet_NaN();  // nothing to reuse
  const uint64_t reused = std::min(hinted_loads_reused[tier_index(tier)], loads);
  return static_cast<double>(reused) / static_cast<double>(loads);
}

double BaselineResult::prefetch_timeliness() const {
  if (prefetches == 0) return 1.0;
  const uint64_t late = std::min(late_prefetches, prefetches);
  return 1.0 - static_cast<double>(late) / static_cast<double>(prefetches);
}

}  // namespace kvtier::bench::run
