// A second, independent workload for the replay, to check that the policies are not tuned to one
// trace: multi-turn chat sessions that share a few system prompts.
//
// Sessions arrive as a Poisson process. Each picks a system prompt by a Zipf law (a few prompts
// are shared by most sessions), opens with a user message of log-normal length, and continues for
// a geometric number of turns, each after an exponential think time; a turn's prompt is the
// previous prompt plus the model's answer plus a new message, so it reuses every full 512-token
// block of the previous prompt (the previous last block, partial, is rewritten and gets a new id).
// Output is the trace format of trace.hpp, sorted by timestamp, deterministic for a seed.
#pragma once

#include <cstdint>

#include "bench/replay/trace.hpp"

namespace kvtier::replay {

struct ChatTraceOptions {
  uint64_t requests = 4000;
  uint64_t seed = 1;
  uint32_t system_prompts = 16;
  double zipf_s = 1.1;              // popularity skew of system prompts
  double mean_turns = 4.0;          // geometric number of turns per session
  double session_rate_per_s = 1.0;  // new sessions per second
  double mean_think_s = 90.0;       // between turns of a session
};

Trace generate_chat_trace(const ChatTraceOptions& options);

}  // namespace kvtier::replay
