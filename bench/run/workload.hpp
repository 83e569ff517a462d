// Workloads of the long-context benchmark: requests with arrival times, prompt and output lengths,
// and the content keys of their blocks — from named, parameterised generators or a trace.
//
// A request's `keys` are the chained content keys (include/kvtier/block_key.hpp) of every full
// block of its prompt followed by its answer, at the simulation's page size: keys[0, input/page)
// are the prompt's, passed to open_sequence; the rest become full while the answer is decoded and
// are published at end_step, so a later turn that repeats the answer (multi-turn chat, agents)
// reuses them. Keys are built from "segments" — runs of tokens named by a 64-bit id, equal ids
// meaning equal tokens — so prompts that share their first segments share the keys of every block
// lying wholly inside them, and a block that straddles into a differing segment does not; no token
// ids are ever materialised (a 1M-token context is 4096 keys, not 4 MB of tokens).
//
// Generators (each deterministic for its seed; arrivals are an open loop fixed in advance):
//   chat          users whose conversations grow append-only: turn t's prompt is the system
//                 prompt + every earlier message and answer + a new message; turns follow each
//                 other after a think time.
//   agent         agents sharing a long system prompt and tool list; each step appends the
//                 previous action (the model's output) and a tool observation, after a tool
//                 latency.
//   docs          a corpus of long documents; questions arrive as a Poisson process, each asking
//                 about one document (Zipf popularity) under a shared system prompt.
//   long_context  one very long context (e.g. 1M tokens) asked `questions` questions in turn; the
//                 workload asks for an HBM KV tier a fraction of the context's KV.
//   mix           chat, agent and docs interleaved in one arrival stream (the default run).
//   trace         a JSONL trace in the ../shared/traces format (bench/replay/trace.hpp), its
//                 timestamps scaled by time_scale; 512-token trace blocks become 512 / page blocks.
// Parameter bounds (an error names the parameter and its range; nothing is clamped silently):
// users, agents, documents 1..100000; system_prompts 1..10000; questions 1..1000000 (docs),
// 1..10000 (long_context); every token length 1..10000000; rate 0.001..1000000 per second;
// turns, steps 1..1000; think_s, tool_s 0..3600; gap_s 0..86400; zipf 0..10; hbm_fraction (0, 1].
// And whatever the parameters, a workload whose requests and keys would exceed 2 GiB of memory
// is refused while it is generated.
// Plain data; built once, then read by every baseline's thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "scheduler/clock.hpp"

namespace kvtier::bench::run {

struct Request {
  uint64_t id = 0;
  Nanos arrival = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  std::vector<BlockKey> keys;  // full blocks of prompt + answer (see the header comment)
  uint32_t kind = 0;           // index into Workload::kinds

  uint64_t prompt_blocks(uint32_t page_tokens) const {
    const uint64_t full = input_tokens / page_tokens;
    return full < keys.size() ? full : keys.size();
  }
};

struct Workload {
  std::string name;
  std::string description;  // the parameters, in words, for the report
  uint32_t page_tokens = 0;
  std::vector<std::string> kinds;
  std::vector<Request> requests;  // by arrival
  // long_context: the HBM KV tier the workload asks for, as a fraction of its longest request's
  // KV (0 = the preset's HBM).
  double hbm_kv_fraction = 0;

  uint64_t total_input_tokens() const;
  uint64_t total_output_tokens() const;
  uint64_t max_request_tokens() const;  // input + output of the longest request
};

// Named parameters of a generator, as given on the command line ("users=64,turns=6"). Unknown
// names are errors that list the known ones.
using WorkloadParams = std::map<std::string, std::string, std::less<>>;

Result<WorkloadParams> parse_workload_params(std::string_view text);

// The names generate_workload knows, with one line each and their parameters with defaults.
struct WorkloadInfo {
  std::string_view name;
  std::string_view summary;
  std::string_view params;  // "users=48 turns=5 ..."
};
std::vector<WorkloadInfo> workload_infos();

// Whatever the parameters, a generated workload's requests and keys take at most this memory.
inline constexpr uint64_t kMaxWorkloadBytes = uint64_t{2} << 30;

// Builds the named workload (not "trace") at `page_tokens` tokens per block; kInvalidArgument
// naming the parameter for one out of its bounds, or when the requests would take more than
// `max_bytes` of memory.
Result<Workload> generate_workload(std::string_view name, const WorkloadParams& params,
                                   uint64_t seed, uint32_t page_tokens,
                                   uint64_t max_bytes = kMaxWorkloadBytes);

// The trace at `path`, timestamps multiplied by `time_scale` (> 0); at most `max_requests`
// requests (0 = all). page_tokens must divide 512.
Result<Workload> load_trace_workload(const std::string& path, double time_scale,
                                     uint64_t max_requests, uint32_t page_tokens);

// Keys of a token stream made of segments (see the header comment). Copyable: a copy is a branch.
class SegmentStream {
 public:
  SegmentStream(std::string_view key_namespace, uint32_t page_tokens);
  void append(uint64_t segment_id, uint64_t tokens);
  uint64_t tokens() const { return tokens_; }
  const std::vector<BlockKey>& keys() const { return keys_; }

 private:
  uint32_t page_tokens_;
  BlockKey root_;
  uint64_t tokens_ = 0;
  std::vector<BlockKey> keys_;
  std::vector<uint32_t> partial_;  // words describing the pieces of the partial last block
  uint32_t partial_fill_ = 0;
};

}  // namespace kvtier::bench::run
