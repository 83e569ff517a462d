// Workload generators, the trace loader and segment streams. See workload.hpp.
#include "bench/run/workload.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "bench/replay/trace.hpp"
#include "bench/replay/workload.hpp"
#include "runtime/config_size.hpp"
#include "runtime/config_suggest.hpp"

namespace kvtier::bench::run {
namespace {

// SplitMix64 and distributions written out, so a seed gives the same workload with any standard
// library (std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // (0, 1)
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }
  double exponential(double mean) { return -std::log(uniform()) * mean; }
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
  // Log-normal with the given median and shape sigma, clamped to [lo, hi].
  uint64_t lognormal(double median, double sigma, uint64_t lo, uint64_t hi) {
    const double v = median * std::exp(sigma * normal());
    return std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(v)), lo, hi);
  }
  // Geometric number of trials >= 1 with the given mean.
  uint32_t geometric(double mean) {
    const double p = 1.0 / std::max(1.0, mean);
    if (p >= 1.0) return 1;
    return 1 + static_cast<uint32_t>(std::floor(std::log(uniform()) / std::log1p(-p)));
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }

 private:
  uint64_t state_;
};

// Zipf(s) over [0, n): inverse CDF over precomputed weights.
class Zipf {
 public:
  Zipf(uint32_t n, double s) {
    double sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
      sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
      cdf_.push_back(sum);
    }
    for (double& c : cdf_) c /= sum;
  }
  uint32_t sample(Rng& rng) const {
    const double u = rng.uniform();
    return static_cast<uint32_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

// Bounds of the generators' parameters (workload.hpp lists them): far beyond any benchmark, but
// small enough that no value can overflow a conversion or the int64 nanosecond clock.
constexpr uint64_t kMaxPopulation = 100000;  // users, agents, documents
constexpr uint64_t kMaxTokens = 10000000;    // any token length: 10M tokens
constexpr double kMaxRate = 1e6;             // arrivals per second
constexpr double kMinRate = 1e-3;            // one arrival per ~17 minutes
constexpr double kMaxMeanRounds = 1000;      // turns, steps (means of a geometric count)
constexpr double kMaxPauseS = 3600;          // think_s, tool_s

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Parameters of one generator: declared with defaults and bounds, read with checks.
class Params {
 public:
  Params(std::string_view workload, const WorkloadParams& given)
      : workload_(workload), given_(given) {}

  // A number in [lo, hi].
  double number(std::string_view name, double fallback, double lo, double hi) {
    known_.push_back(name);
    auto it = given_.find(name);
    if (it == given_.end()) return fallback;
    std::istringstream in(it->second);
    double v = 0;
    in >> v;
    const bool is_number = !in.fail() && in.eof() && std::isfinite(v);
    if (!is_number || v < lo || v > hi) {
      if (error_.ok()) {
        error_ =
            invalid_argument("workload " + std::string(workload_) + ": " + std::string(name) + "=" +
                             it->second + (is_number ? " is out of range" : " is not a number") +
                             ": it must be from " + number_text(lo) + " to " + number_text(hi));
      }
      return fallback;
    }
    return v;
  }
  // A whole number in [lo, hi] (counts and token lengths; a fraction rounds to the nearest).
  uint64_t whole(std::string_view name, double fallback, uint64_t lo, uint64_t hi) {
    const double v = number(name, fallback, static_cast<double>(lo), static_cast<double>(hi));
    return std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(v)), lo, hi);
  }
  uint64_t tokens(std::string_view name, double fallback) {
    return whole(name, fallback, 1, kMaxTokens);
  }
  // A token length that is the median of a distribution.
  double median_tokens(std::string_view name, double fallback) {
    return number(name, fallback, 1, static_cast<double>(kMaxTokens));
  }
  uint64_t population(std::string_view name, double fallback) {
    return whole(name, fallback, 1, kMaxPopulation);
  }
  double rate(std::string_view name, double fallback) {
    return number(name, fallback, kMinRate, kMaxRate);
  }
  double rounds(std::string_view name, double fallback) {
    return number(name, fallback, 1, kMaxMeanRounds);
  }
  double pause_s(std::string_view name, double fallback) {
    return number(name, fallback, 0, kMaxPauseS);
  }
  // Every given name must have been asked for.
  Status finish() {
    if (!error_.ok()) return error_;
    for (const auto& [name, value] : given_) {
      if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
        std::string msg = "workload " + std::string(workload_) + " has no parameter " + name +
                          " (known: " + join_words(known_) + ")";
        if (auto near = closest_match(name, known_))
          msg += "; did you mean " + std::string(*near) + "?";
        return invalid_argument(msg);
      }
    }
    return ok_status();
  }

 private:
  std::string_view workload_;
  const WorkloadParams& given_;
  std::vector<std::string_view> known_;
  Status error_;
};

Nanos seconds(double s) { return static_cast<Nanos>(s * 1e9); }

// Segment ids: the kind in the top byte, so the parts of a mix never collide.
uint64_t segment(uint32_t kind, uint64_t n) { return (static_cast<uint64_t>(kind) << 56) | n; }

uint64_t request_bytes(std::size_t keys) { return sizeof(Request) + keys * sizeof(BlockKey); }

struct Builder {
  Builder(Workload& workload, uint32_t k, uint64_t most_bytes)
      : w(workload), kind(k), max_bytes(most_bytes) {
    for (const Request& r : w.requests) bytes += request_bytes(r.keys.size());
  }

  Workload& w;
  uint32_t kind;
  uint64_t max_bytes;
  uint64_t next_segment = 1;
  uint64_t bytes = 0;  // of the whole workload (a mix's earlier parts included)
  Status status;       // the memory bound's verdict; generators stop when it is an error

  uint64_t fresh() { return segment(kind, next_segment++); }
  bool ok() const { return status.ok(); }
  // Counts `more` bytes (requests, or streams held while generating) against the bound.
  bool charge(uint64_t more) {
    bytes += more;
    if (bytes > max_bytes && status.ok()) {
      status = invalid_argument(
          "workload " + w.kinds[kind] + ": the requests would take more than " +
          format_size_approx(max_bytes) + " of memory (" + std::to_string(w.requests.size()) +
          " requests of " + std::to_string(w.page_tokens) +
          "-token pages so far); lower the number of requests (users, agents, questions, turns, "
          "steps) or their token lengths, or raise --page-tokens");
    }
    return status.ok();
  }
  void add(const SegmentStream& stream, Nanos arrival, uint64_t input, uint64_t output) {
    if (!charge(request_bytes(stream.keys().size()))) return;
    Request r;
    r.arrival = arrival;
    r.input_tokens = input;
    r.output_tokens = output;
    r.keys = stream.keys();
    r.kind = kind;
    w.requests.push_back(std::move(r));
  }
};

constexpr std::string_view kNamespace = "kvtier.bench.run";

Status gen_chat(Workload& w, uint32_t kind, const WorkloadParams& given, uint64_t seed,
                uint64_t max_bytes) {
  Params p("chat", given);
  const uint64_t users = p.population("users", 160);
  const double rate = p.rate("rate", 1.0);  // new conversations per second
  const uint64_t system_prompts = p.whole("system_prompts", 4, 1, 10000);
  const uint64_t system_tokens = p.tokens("system_tokens", 2000);
  const double turns = p.rounds("turns", 6);
  const double message = p.median_tokens("message_tokens", 400);
  const double answer = p.median_tokens("answer_tokens", 300);
  const double think = p.pause_s("think_s", 30);
  KVTIER_RETURN_IF_ERROR(p.finish());
  Rng rng(seed);
  Builder b(w, kind, max_bytes);
  const uint64_t system_base = b.next_segment;
  b.next_segment += system_prompts;
  Nanos start = 0;
  for (uint64_t u = 0; u < users && b.ok(); ++u) {
    start += seconds(rng.exponential(1.0 / rate));
    SegmentStream s(kNamespace, w.page_tokens);
    s.append(segment(kind, system_base + rng.below(system_prompts)), system_tokens);
    const uint32_t n = rng.geometric(turns);
    Nanos t = start;
    for (uint32_t turn = 0; turn < n && b.ok(); ++turn) {
      s.append(b.fresh(), rng.lognormal(message, 0.8, 8, 8000));
      const uint64_t input = s.tokens();
      const uint64_t out = rng.lognormal(answer, 0.7, 4, 2000);
      SegmentStream with_answer = s;
      with_answer.append(b.fresh(), out);
      b.add(with_answer, t, input, out);
      s = std::move(with_answer);
      t += seconds(rng.exponential(think));
    }
  }
  return b.status;
}

Status gen_agent(Workload& w, uint32_t kind, const WorkloadParams& given, uint64_t seed,
                 uint64_t max_bytes) {
  Params p("agent", given);
  const uint64_t agents = p.population("agents", 48);
  const double rate = p.rate("rate", 0.4);                          // agents starting per second
  const uint64_t system_tokens = p.tokens("system_tokens", 12000);  // instructions + tool schemas
  const uint64_t task_tokens = p.tokens("task_tokens", 800);
  const double steps = p.rounds("steps", 12);
  const double action = p.median_tokens("action_tokens", 150);
  const double observation = p.median_tokens("observation_tokens", 1500);
  const double tool = p.pause_s("tool_s", 3);
  KVTIER_RETURN_IF_ERROR(p.finish());
  Rng rng(seed);
  Builder b(w, kind, max_bytes);
  const uint64_t system = b.fresh();
  Nanos start = 0;
  for (uint64_t a = 0; a < agents && b.ok(); ++a) {
    start += seconds(rng.exponential(1.0 / rate));
    SegmentStream s(kNamespace, w.page_tokens);
    s.append(system, system_tokens);
    s.append(b.fresh(), task_tokens);
    const uint32_t n = rng.geometric(steps);
    Nanos t = start;
    for (uint32_t step = 0; step < n && b.ok(); ++step) {
      const uint64_t input = s.tokens();
      const uint64_t out = rng.lognormal(action, 0.6, 8, 1500);
      SegmentStream with_action = s;
      with_action.append(b.fresh(), out);
      b.add(with_action, t, input, out);
      s = std::move(with_action);
      s.append(b.fresh(), rng.lognormal(observation, 1.0, 16, 16000));
      t += seconds(rng.exponential(tool));
    }
  }
  return b.status;
}

Status gen_docs(Workload& w, uint32_t kind, const WorkloadParams& given, uint64_t seed,
                uint64_t max_bytes) {
  Params p("docs", given);
  const uint64_t documents = p.population("documents", 40);
  const double doc_tokens = p.median_tokens("doc_tokens", 40000);
  const uint64_t questions = p.whole("questions", 600, 1, 1000000);
  const double rate = p.rate("rate", 2.0);
  const double zipf = p.number("zipf", 0.8, 0, 10);
  const uint64_t system_tokens = p.tokens("system_tokens", 500);
  const double question = p.median_tokens("question_tokens", 60);
  const double answer = p.median_tokens("answer_tokens", 200);
  KVTIER_RETURN_IF_ERROR(p.finish());
  Rng rng(seed);
  Builder b(w, kind, max_bytes);
  const uint64_t system = b.fresh();
  std::vector<SegmentStream> docs;
  for (uint64_t d = 0; d < documents && b.ok(); ++d) {
    SegmentStream s(kNamespace, w.page_tokens);
    s.append(system, system_tokens);
    s.append(b.fresh(), rng.lognormal(doc_tokens, 0.4, 1000, 1000000));
    b.charge(request_bytes(s.keys().size()));  // the corpus is held while questions are drawn
    docs.push_back(std::move(s));
  }
  KVTIER_RETURN_IF_ERROR(b.status);
  const Zipf pick(static_cast<uint32_t>(documents), zipf);
  Nanos t = 0;
  for (uint64_t q = 0; q < questions && b.ok(); ++q) {
    t += seconds(rng.exponential(1.0 / rate));
    SegmentStream s = docs[pick.sample(rng)];
    s.append(b.fresh(), rng.lognormal(question, 0.5, 4, 2000));
    const uint64_t input = s.tokens();
    const uint64_t out = rng.lognormal(answer, 0.6, 4, 2000);
    s.append(b.fresh(), out);
    b.add(s, t, input, out);
  }
  return b.status;
}

Status gen_long_context(Workload& w, uint32_t kind, const WorkloadParams& given, uint64_t seed,
                        uint64_t max_bytes) {
  Params p("long_context", given);
  const uint64_t context = p.tokens("context", 1000000);
  const uint64_t questions = p.whole("questions", 2, 1, 10000);
  const uint64_t question = p.tokens("question_tokens", 100);
  const uint64_t answer = p.tokens("answer_tokens", 64);
  const double gap = p.number("gap_s", 30, 0, 86400);
  const double fraction = p.number("hbm_fraction", 0.2, 0, 1);
  KVTIER_RETURN_IF_ERROR(p.finish());
  if (fraction <= 0 || fraction > 1) {
    return invalid_argument("workload long_context: hbm_fraction must be in (0, 1]");
  }
  (void)seed;  // nothing random: one context, questions at fixed gaps
  Builder b(w, kind, max_bytes);
  SegmentStream ctx(kNamespace, w.page_tokens);
  ctx.append(b.fresh(), context);
  Nanos t = 0;
  for (uint64_t q = 0; q < questions && b.ok(); ++q) {
    SegmentStream s = ctx;
    s.append(b.fresh(), question);
    const uint64_t input = s.tokens();
    s.append(b.fresh(), answer);
    b.add(s, t, input, answer);
    t += seconds(gap);
  }
  w.hbm_kv_fraction = fraction;
  return b.status;
}

using Generator = Status (*)(Workload&, uint32_t, const WorkloadParams&, uint64_t, uint64_t);

struct Named {
  WorkloadInfo info;
  Generator gen;
};

const std::array<Named, 4> kGenerators = {{
    {{"chat", "multi-turn chat: conversations grow append-only, turn after turn",
      "users=160 rate=1 system_prompts=4 system_tokens=2000 turns=6 message_tokens=400 "
      "answer_tokens=300 think_s=30"},
     &gen_chat},
    {{"agent", "agent loops: a long shared system prompt and tools, then actions and observations",
      "agents=48 rate=0.4 system_tokens=12000 task_tokens=800 steps=12 action_tokens=150 "
      "observation_tokens=1500 tool_s=3"},
     &gen_agent},
    {{"docs", "a document corpus loaded once, then many questions against it",
      "documents=40 doc_tokens=40000 questions=600 rate=2 zipf=0.8 system_tokens=500 "
      "question_tokens=60 answer_tokens=200"},
     &gen_docs},
    {{"long_context", "one very long context, decoded with HBM smaller than its KV",
      "context=1000000 questions=2 question_tokens=100 answer_tokens=64 gap_s=30 hbm_fraction=0.2"},
     &gen_long_context},
}};

void finalize(Workload& w) {
  std::stable_sort(w.requests.begin(), w.requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  for (std::size_t i = 0; i < w.requests.size(); ++i) w.requests[i].id = i;
}

std::string describe(std::string_view name, const WorkloadParams& params) {
  std::string s(name);
  for (const auto& [k, v] : params) s += " " + k + "=" + v;
  return s;
}

}  // namespace

uint64_t Workload::total_input_tokens() const {
  uint64_t t = 0;
  for (const Request& r : requests) t += r.input_tokens;
  return t;
}

uint64_t Workload::total_output_tokens() const {
  uint64_t t = 0;
  for (const Request& r : requests) t += r.output_tokens;
  return t;
}

uint64_t Workload::max_request_tokens() const {
  uint64_t m = 0;
  for (const Request& r : requests) m = std::max(m, r.input_tokens + r.output_tokens);
  return m;
}

SegmentStream::SegmentStream(std::string_view key_namespace, uint32_t page_tokens)
    : page_tokens_(page_tokens), root_(namespace_root(key_namespace)) {}

void SegmentStream::append(uint64_t segment_id, uint64_t tokens) {
  uint64_t offset = 0;
  while (tokens > 0) {
    const uint64_t take = std::min<uint64_t>(tokens, page_tokens_ - partial_fill_);
    // A piece: which segment, where in it, how long. Equal pieces in equal order = equal tokens.
    partial_.insert(partial_.end(),
                    {static_cast<uint32_t>(segment_id), static_cast<uint32_t>(segment_id >> 32),
                     static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                     static_cast<uint32_t>(take)});
    partial_fill_ += static_cast<uint32_t>(take);
    offset += take;
    tokens -= take;
    tokens_ += take;
    if (partial_fill_ == page_tokens_) {
      const BlockKey parent = keys_.empty() ? root_ : keys_.back();
      keys_.push_back(chain_block_key(parent, partial_));
      partial_.clear();
      partial_fill_ = 0;
    }
  }
}

Result<WorkloadParams> parse_workload_params(std::string_view text) {
  WorkloadParams out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return invalid_argument("workload parameter \"" + std::string(item) +
                              "\" is not NAME=VALUE (e.g. users=64,turns=6)");
    }
    out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return out;
}

std::vector<WorkloadInfo> workload_infos() {
  std::vector<WorkloadInfo> out;
  out.push_back({"mix", "chat, agent and docs in one arrival stream (the default run)",
                 "chat.users=200 chat.rate=0.12 chat.think_s=60 agent.agents=40 agent.rate=0.02 "
                 "agent.steps=15 agent.tool_s=4 docs.documents=100 docs.doc_tokens=32000 "
                 "docs.questions=800 docs.rate=0.4 docs.zipf=0.7 (any parameter of a part, "
                 "prefixed)"});
  for (const Named& n : kGenerators) out.push_back(n.info);
  out.push_back(
      {"trace", "a JSONL trace with arrival times (--trace PATH)", "--time-scale, --max-requests"});
  return out;
}

Result<Workload> generate_workload(std::string_view name, const WorkloadParams& params,
                                   uint64_t seed, uint32_t page_tokens, uint64_t max_bytes) {
  if (page_tokens == 0) return invalid_argument("page_tokens must be > 0");
  Workload w;
  w.name = std::string(name);
  w.page_tokens = page_tokens;
  w.description = describe(name, params);
  if (name == "mix") {
    // Parameters are routed by prefix ("chat.users=80").
    // The default run: about an hour of modeled traffic on one H200 — a corpus larger than HBM
    // and host memory together (NVMe holds its tail), conversations and agents returning after
    // a think time or a tool call.
    std::array<WorkloadParams, 3> parts = {
        WorkloadParams{{"users", "200"}, {"rate", "0.12"}, {"think_s", "60"}},
        WorkloadParams{{"agents", "40"}, {"rate", "0.02"}, {"steps", "15"}, {"tool_s", "4"}},
        WorkloadParams{{"documents", "100"},
                       {"doc_tokens", "32000"},
                       {"questions", "800"},
                       {"rate", "0.4"},
                       {"zipf", "0.7"}},
    };
    const std::array<std::string_view, 3> prefixes = {"chat", "agent", "docs"};
    for (const auto& [k, v] : params) {
      const std::size_t dot = k.find('.');
      const std::string_view prefix =
          dot == std::string::npos ? std::string_view() : std::string_view(k).substr(0, dot);
      auto it = std::find(prefixes.begin(), prefixes.end(), prefix);
      if (it == prefixes.end()) {
        return invalid_argument("workload mix: parameter " + k +
                                " must name its part: chat.NAME, agent.NAME or docs.NAME");
      }
      parts[it - prefixes.begin()][k.substr(dot + 1)] = v;
    }
    for (uint32_t i = 0; i < 3; ++i) {
      w.kinds.emplace_back(prefixes[i]);
      KVTIER_RETURN_IF_ERROR(kGenerators[i].gen(w, i, parts[i], seed * 31 + i, max_bytes));
    }
    finalize(w);
    return w;
  }
  for (const Named& n : kGenerators) {
    if (n.info.name != name) continue;
    w.kinds.emplace_back(name);
    KVTIER_RETURN_IF_ERROR(n.gen(w, 0, params, seed, max_bytes));
    finalize(w);
    return w;
  }
  std::vector<std::string_view> names;
  for (const WorkloadInfo& i : workload_infos()) names.push_back(i.name);
  std::string msg =
      "no workload named \"" + std::string(name) + "\" (known: " + join_words(names) + ")";
  if (auto near = closest_match(name, names)) msg += "; did you mean " + std::string(*near) + "?";
  return invalid_argument(msg);
}

Result<Workload> load_trace_workload(const std::string& path, double time_scale,
                                     uint64_t max_requests, uint32_t page_tokens) {
  if (!(time_scale > 0) || !(time_scale <= 1e6)) {
    return invalid_argument("--time-scale must be > 0 and at most 1000000");
  }
  KVTIER_ASSIGN_OR_RETURN(replay::Trace trace, replay::load_trace(path));
  if (max_requests > 0 && trace.requests.size() > max_requests) trace.requests.resize(max_requests);
  KVTIER_ASSIGN_OR_RETURN(replay::ReplayWorkload rw, replay::build_workload(trace, page_tokens));
  Workload w;
  w.name = "trace";
  w.page_tokens = page_tokens;
  w.kinds = {"trace"};
  std::ostringstream d;
  d << "trace " << path << " (" << trace.requests.size() << " requests";
  if (time_scale != 1.0) d << ", time x" << time_scale;
  d << ")";
  w.description = d.str();
  for (std::size_t i = 0; i < rw.requests(); ++i) {
    Request r;
    const double arrival_ns = static_cast<double>(rw.timestamps_ms[i]) * time_scale * 1e6;
    if (!(arrival_ns < 9e18)) {  // past the int64 nanosecond clock (~292 years)
      return invalid_argument("trace " + path + ": request " + std::to_string(i) +
                              " arrives too late for the clock with --time-scale " +
                              number_text(time_scale));
    }
    r.arrival = static_cast<Nanos>(arrival_ns);
    r.input_tokens = rw.input_tokens[i];
    r.output_tokens = std::max<uint64_t>(1, trace.requests[i].output_length);
    // The trace names its partial last block like any other; only full blocks have content keys.
    const auto keys = rw.request_keys(i);
    const std::size_t full = std::min<std::size_t>(keys.size(), r.input_tokens / page_tokens);
    r.keys.assign(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(full));
    w.requests.push_back(std::move(r));
  }
  finalize(w);
  return w;
}

}  // namespace kvtier::bench::run
