// Generated workloads for the replay, to check that the policies are not tuned to one trace.
//
// Chat: multi-turn chat sessions that share a few system prompts.
// Sessions arrive as a Poisson process. Each picks a system prompt by a Zipf law (a few prompts
// are shared by most sessions), opens with a user message of log-normal length, and continues for
// a geometric number of turns, each after an exponential think time; a turn's prompt is the
// previous prompt plus the model's answer plus a new message, so it reuses every full 512-token
// block of the previous prompt (the previous last block, partial, is rewritten and gets a new id).
//
// Agent: tool-using agent loops. A session picks a tool set (a long shared prompt, Zipf-popular),
// states a task, then runs steps a few seconds apart, each prompt the previous one plus the
// model's action and the tool's output; some steps retry (the context goes back one step and
// continues differently, so the session branches), and some finished sessions are resumed minutes
// later by a follow-up. Reuse is short-gapped and deep within a session, long-gapped across
// resumptions, and shared across sessions only through the tool sets.
//
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

struct AgentTraceOptions {
  uint64_t requests = 4000;
  uint64_t seed = 1;
  uint32_t tool_sets = 8;
  double zipf_s = 1.0;              // popularity skew of tool sets
  double mean_steps = 10.0;         // geometric number of steps per session
  double session_rate_per_s = 0.4;  // new sessions per second
  double mean_step_gap_s = 4.0;     // between steps (decode + tool time)
  double retry_probability = 0.1;   // a step that goes back one step first
  double resume_probability = 0.3;  // a finished session that gets a follow-up
  double mean_resume_s = 300.0;     // until the follow-up
};

Trace generate_agent_trace(const AgentTraceOptions& options);

}  // namespace kvtier::replay
