// Request traces for `kvtier-bench replay`: the JSONL format of the public Mooncake traces (one
// request per line: timestamp in ms, input_length and output_length in tokens, hash_ids — one id
// per 512-token block of the prompt, each standing for that block together with its whole prefix,
// so equal ids mean reusable KV; the last block may be partial).
//
// The parser is a small strict JSON reader (objects, arrays, strings, numbers, literals); unknown
// fields are skipped, so traces with extra fields load. The format's four fields are required, with
// no silent defaults (a missing timestamp would replay as an arrival at 0), and each field may
// appear once per request. input_length is 1..2^40 tokens (timestamp and output_length at most
// 2^40 too, so sums and ms-to-ns scaling cannot overflow), and len(hash_ids) ==
// ceil(input_length / 512), as the format defines it. Requests must be sorted by timestamp (equal
// ones allowed), as the format says: the replay serves them in file order, so an unsorted file is
// refused rather than replayed in an order its timestamps contradict. A trace has at least one
// request. Strings follow JSON: its escapes only, the u escape with four hex digits (decoded to
// UTF-8, surrogates paired), no raw control characters. Every error names the file, line and column
// and what was expected, with input bytes other than printable ASCII shown as \xNN, so messages
// are plain ASCII whatever the file holds; nothing aborts on bad input. load_trace() reads
// regular files only (a directory opens, then fails to read). A trace is plain data, immutable
// once loaded and shared read-only by the replay threads. Rejected: a JSON library dependency for
// four fields of one known shape (none is among the project's packages), and regex scanning (it
// cannot report where a malformed line breaks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"

namespace kvtier::replay {

// Tokens per trace block (the `hash_ids` granularity).
inline constexpr uint32_t kTraceBlockTokens = 512;

struct TraceRequest {
  uint64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
  friend bool operator==(const TraceRequest&, const TraceRequest&) = default;
};

struct Trace {
  std::string source;  // file path, or a description for generated traces
  std::vector<TraceRequest> requests;

  uint64_t total_input_tokens() const;
};

// Parses JSONL text; `source` names it in error messages. Blank lines are skipped; a text with no
// request is kInvalidArgument ("<source>: no requests").
Result<Trace> parse_trace(std::string_view text, std::string source);
// kIoError when the file cannot be opened or read (with errno), kInvalidArgument when it is not a
// regular file or does not parse.
Result<Trace> load_trace(const std::string& path);

// One JSONL line per request, in the same format (used to save generated traces).
std::string format_trace_line(const TraceRequest& request);

}  // namespace kvtier::replay
