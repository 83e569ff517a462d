#include "bench/replay/synthetic_trace.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace kvtier::replay {
namespace {

struct Session {
  std::vector<uint64_t> ids;  // ids of the previous prompt's blocks
  uint64_t tokens = 0;        // previous prompt's length
  uint32_t turns_left = 0;
  bool started = false;
};

struct Event {
  double time_s;
  uint64_t session;
  bool operator>(const Event& o) const { return time_s > o.time_s; }
};

// Prefixes many requests start with (system prompts, tool sets): `count` of them (at least one),
// each min_blocks..max_blocks full blocks with fresh ids, picked by a Zipf(s) law over their rank.
struct SharedPrefixes {
  std::vector<std::vector<uint64_t>> ids;
  std::discrete_distribution<std::size_t> rank;
  const std::vector<uint64_t>& pick(std::mt19937_64& rng) { return ids[rank(rng)]; }
};

SharedPrefixes shared_prefixes(uint32_t count, uint32_t min_blocks, uint32_t max_blocks,
                               double zipf_s, std::mt19937_64& rng, uint64_t& next_id) {
  SharedPrefixes out;
  out.ids.resize(std::max<uint32_t>(1, count));
  std::vector<double> weights(out.ids.size());
  std::uniform_int_distribution<uint32_t> blocks(min_blocks, max_blocks);
  for (std::size_t p = 0; p < out.ids.size(); ++p) {
    const uint32_t n = blocks(rng);
    for (uint32_t b = 0; b < n; ++b) out.ids[p].push_back(next_id++);
    weights[p] = 1.0 / std::pow(static_cast<double>(p + 1), zipf_s);
  }
  out.rank = std::discrete_distribution<std::size_t>(weights.begin(), weights.end());
  return out;
}

}  // namespace

Trace generate_chat_trace(const ChatTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> arrivals(o.session_rate_per_s);
  std::exponential_distribution<double> think(1.0 / o.mean_think_s);
  std::geometric_distribution<uint32_t> turns(1.0 / std::max(1.0, o.mean_turns));
  std::lognormal_distribution<double> first_message(std::log(3000.0), 1.0);
  std::lognormal_distribution<double> next_message(std::log(300.0), 1.0);
  std::lognormal_distribution<double> answer(std::log(250.0), 0.7);

  uint64_t next_id = 0;
  // System prompts: 1..8 full blocks each, their own ids.
  SharedPrefixes prompts = shared_prefixes(o.system_prompts, 1, 8, o.zipf_s, rng, next_id);

  std::vector<Session> sessions;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  double next_arrival = 0;
  Trace trace;
  trace.source = "synthetic chat (seed " + std::to_string(o.seed) + ")";
  while (trace.requests.size() < o.requests) {
    if (events.empty() || next_arrival <= events.top().time_s) {
      Session s;
      s.ids = prompts.pick(rng);
      s.tokens = s.ids.size() * kTraceBlockTokens;
      s.turns_left = 1 + turns(rng);
      sessions.push_back(std::move(s));
      events.push(Event{next_arrival, sessions.size() - 1});
      next_arrival += arrivals(rng);
      continue;
    }
    const Event e = events.top();
    events.pop();
    Session& s = sessions[e.session];
    const bool first = !s.started;
    s.started = true;
    const uint64_t added =
        1 + static_cast<uint64_t>(first ? first_message(rng) : answer(rng) + next_message(rng));
    // Keep the full blocks of the previous prompt; the partial last one is rewritten.
    const uint64_t kept = s.tokens / kTraceBlockTokens;
    s.ids.resize(kept);
    s.tokens += added;
    const uint64_t blocks = (s.tokens + kTraceBlockTokens - 1) / kTraceBlockTokens;
    while (s.ids.size() < blocks) s.ids.push_back(next_id++);
    TraceRequest r;
    r.timestamp_ms = static_cast<uint64_t>(e.time_s * 1000.0);
    r.input_length = s.tokens;
    r.output_length = 1 + static_cast<uint64_t>(answer(rng));
    r.hash_ids = s.ids;
    trace.requests.push_back(std::move(r));
    if (--s.turns_left > 0) events.push(Event{e.time_s + think(rng), e.session});
  }
  std::stable_sort(
      trace.requests.begin(), trace.requests.end(),
      [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  return trace;
}

}  // namespace kvtier::replay

namespace kvtier::replay {
namespace {

struct AgentContext {
  std::vector<uint64_t> ids;
  uint64_t tokens = 0;
};

struct AgentSession {
  AgentContext now;
  AgentContext before;  // the context one step back (a retry restarts from it)
  uint32_t steps_left = 0;
  bool resumed = false;
};

}  // namespace

Trace generate_agent_trace(const AgentTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> arrivals(o.session_rate_per_s);
  std::exponential_distribution<double> step_gap(1.0 / o.mean_step_gap_s);
  std::exponential_distribution<double> resume_gap(1.0 / o.mean_resume_s);
  std::geometric_distribution<uint32_t> steps(1.0 / std::max(1.0, o.mean_steps));
  std::bernoulli_distribution retry(o.retry_probability);
  std::bernoulli_distribution resume(o.resume_probability);
  std::lognormal_distribution<double> task(std::log(800.0), 1.0);
  std::lognormal_distribution<double> action(std::log(120.0), 0.7);
  std::lognormal_distribution<double> tool_output(std::log(600.0), 1.2);

  uint64_t next_id = 0;
  // Tool sets: 4..24 full blocks each, their own ids.
  SharedPrefixes tools = shared_prefixes(o.tool_sets, 4, 24, o.zipf_s, rng, next_id);

  // Appends `added` tokens: the full blocks stay, the partial last block gets a new id.
  const auto extend = [&](AgentContext& c, uint64_t added) {
    c.ids.resize(c.tokens / kTraceBlockTokens);
    c.tokens += added;
    const uint64_t blocks = (c.tokens + kTraceBlockTokens - 1) / kTraceBlockTokens;
    while (c.ids.size() < blocks) c.ids.push_back(next_id++);
  };

  std::vector<AgentSession> sessions;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  double next_arrival = 0;
  Trace trace;
  trace.source = "synthetic agent (seed " + std::to_string(o.seed) + ")";
  while (trace.requests.size() < o.requests) {
    if (events.empty() || next_arrival <= events.top().time_s) {
      AgentSession s;
      s.now.ids = tools.pick(rng);
      s.now.tokens = s.now.ids.size() * kTraceBlockTokens;
      extend(s.now, 1 + static_cast<uint64_t>(task(rng)));
      s.before = s.now;
      s.steps_left = 1 + steps(rng);
      sessions.push_back(std::move(s));
      events.push(Event{next_arrival, sessions.size() - 1});
      next_arrival += arrivals(rng);
      continue;
    }
    const Event e = events.top();
    events.pop();
    AgentSession& s = sessions[e.session];
    TraceRequest r;
    r.timestamp_ms = static_cast<uint64_t>(e.time_s * 1000.0);
    r.input_length = s.now.tokens;
    r.output_length = 1 + static_cast<uint64_t>(action(rng));
    r.hash_ids = s.now.ids;
    trace.requests.push_back(std::move(r));
    // The next prompt: this one (or, on a retry, the one before) plus an action and its result.
    AgentContext next = retry(rng) ? s.before : s.now;
    s.before = s.now;
    extend(next, 1 + static_cast<uint64_t>(action(rng) + tool_output(rng)));
    s.now = std::move(next);
    if (--s.steps_left > 0) {
      events.push(Event{e.time_s + step_gap(rng), e.session});
    } else if (!s.resumed && resume(rng)) {
      s.resumed = true;
      s.steps_left = 1 + steps(rng);
      events.push(Event{e.time_s + resume_gap(rng), e.session});
    }
  }
  std::stable_sort(
      trace.requests.begin(), trace.requests.end(),
      [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  return trace;
}

}  // namespace kvtier::replay
