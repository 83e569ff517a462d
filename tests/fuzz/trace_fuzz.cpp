// Fuzz target: arbitrary bytes as a trace file for `kvtier-bench replay`. parse_trace must return
// a Trace or a Status for every input — never crash, hang, throw or leak (ASan/UBSan in the fuzz
// preset). An error names the source and is printable ASCII whatever the input held. An accepted
// trace keeps the format's rules (at least one request, sorted timestamps, values in range, one
// hash id per 512-token block), writes back to text that parses to the same requests, and replays:
// every policy and reference returns a result, its per-tier hits sum to its hits, and no cache hits
// more than one that never evicts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/replay/replay.hpp"
#include "bench/replay/trace.hpp"
#include "bench/replay/workload.hpp"

namespace {

using kvtier::replay::Trace;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

constexpr const char* kSource = "fuzz.jsonl";
constexpr uint64_t kMaxValue = uint64_t{1} << 40;

void check_error(const kvtier::Status& status) {
  const std::string& m = status.message();
  if (m.rfind(kSource, 0) != 0) fail("an error that does not name the trace: " + m);
  for (const char c : m) {
    if (c < 0x20 || c > 0x7e) fail("an error that is not printable ASCII: " + m);
  }
}

void check_format_rules(const Trace& trace) {
  if (trace.requests.empty()) fail("an accepted trace with no request");
  uint64_t previous = 0;
  for (const kvtier::replay::TraceRequest& r : trace.requests) {
    if (r.timestamp_ms < previous) fail("an accepted trace out of timestamp order");
    previous = r.timestamp_ms;
    if (r.input_length == 0 || r.input_length > kMaxValue || r.timestamp_ms > kMaxValue ||
        r.output_length > kMaxValue) {
      fail("an accepted request with a value out of range");
    }
    const uint64_t blocks = (r.input_length + kvtier::replay::kTraceBlockTokens - 1) /
                            kvtier::replay::kTraceBlockTokens;
    if (r.hash_ids.size() != blocks) fail("an accepted request whose hash_ids miss its length");
  }
}

void check_round_trip(const Trace& trace) {
  std::string text;
  for (const auto& r : trace.requests) text += kvtier::replay::format_trace_line(r) + "\n";
  auto again = kvtier::replay::parse_trace(text, kSource);
  if (!again.ok()) fail("a written trace does not parse: " + again.status().to_string());
  if (again->requests != trace.requests) fail("a written trace parses to other requests");
}

uint64_t hits_of(const kvtier::replay::ReplayWorkload& w, kvtier::replay::RunKind kind,
                 kvtier::EvictionPolicy policy, uint64_t blocks, uint32_t lookahead) {
  kvtier::replay::RunSpec spec;
  spec.kind = kind;
  spec.eviction = policy;
  spec.capacity_blocks = {blocks, 0, 0};
  kvtier::replay::RunOptions options;
  options.lookahead = lookahead;
  auto r = kvtier::replay::run_replay(w, spec, options);
  if (!r.ok()) fail("a replay of an accepted trace failed: " + r.status().to_string());
  uint64_t by_tier = 0;
  for (const uint64_t t : r->hit_tokens_by_tier) by_tier += t;
  if (by_tier != r->hit_tokens) fail("per-tier hits that do not sum to the hits");
  if (r->hit_tokens > r->total_tokens) fail("more hit tokens than prompt tokens");
  return r->hit_tokens;
}

void check_replay(const Trace& trace) {
  // 128-token blocks: four per trace block, so partial blocks and chains of several blocks occur.
  auto w = kvtier::replay::build_workload(trace, 128);
  if (!w.ok()) fail("an accepted trace gives no workload: " + w.status().to_string());
  using kvtier::EvictionPolicy;
  using kvtier::replay::RunKind;
  const uint64_t never_evicts =
      hits_of(*w, RunKind::kReferenceLru, EvictionPolicy::kLru, uint64_t{1} << 30, 0);
  for (const uint64_t blocks : {uint64_t{1}, uint64_t{6}}) {
    const uint64_t runs[] = {
        hits_of(*w, RunKind::kReferenceLru, EvictionPolicy::kLru, blocks, 0),
        hits_of(*w, RunKind::kBelady, EvictionPolicy::kLru, blocks, 0),
        hits_of(*w, RunKind::kCountOracle, EvictionPolicy::kLru, blocks, 2),
        hits_of(*w, RunKind::kPolicy, EvictionPolicy::kLru, blocks, 0),
        hits_of(*w, RunKind::kPolicy, EvictionPolicy::kLfu, blocks, 0),
        hits_of(*w, RunKind::kPolicy, EvictionPolicy::kS3Fifo, blocks, 0),
        hits_of(*w, RunKind::kPolicy, EvictionPolicy::kPrefixAware, blocks, 0),
        hits_of(*w, RunKind::kPolicy, EvictionPolicy::kLookahead, blocks, 2),
    };
    for (const uint64_t hits : runs) {
      if (hits > never_evicts) fail("a cache hit more than one that never evicts");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto trace = kvtier::replay::parse_trace(text, kSource);
  if (!trace.ok()) {
    check_error(trace.status());
    return 0;
  }
  check_format_rules(*trace);
  check_round_trip(*trace);
  check_replay(*trace);
  return 0;
}
