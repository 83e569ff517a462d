// `kvtier-bench replay`: replays a request trace through the page table and every eviction policy,
// metadata only, over a sweep of capacities, next to two references computed by the same command
// (plain LRU and offline Belady). See bench/replay/replay.hpp for the model.
//
// Capacities: --capacities 1e6,3e6 sweeps one tier (HBM) of that many tokens (decimal whole
// numbers, at least one block; rounded down to whole blocks, and the capacity replayed is the one
// reported); without it, the configuration's tiers (hbm, host, nvme capacities in bytes, converted
// to tokens with the model geometry) are replayed as one three-tier run per policy, with hits
// reported per tier. A capacity beyond the trace costs no memory (replay.hpp). Runs are
// independent and spread over --threads (default: every core); a run that fails, however, fails
// the command with the policy and capacity named. Output: a table on stdout, or one JSON object
// with --json; progress on stderr unless --no-progress. Every result also tallies its hits by
// reuse distance (bench/replay/workload.hpp): in the JSON always, in the table with --by-distance
// (in place of the per-tier columns).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iomanip>
#include <limits>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/kvtier_bench/command.hpp"
#include "bench/replay/replay.hpp"
#include "bench/replay/synthetic_trace.hpp"
#include "bench/replay/trace.hpp"
#include "bench/replay/workload.hpp"
#include "scheduler/policies/evictor.hpp"

namespace kvtier::bench {
namespace {

using replay::RunKind;
using replay::RunResult;
using replay::RunSpec;

constexpr EvictionPolicy kAllPolicies[] = {EvictionPolicy::kLru, EvictionPolicy::kLfu,
                                           EvictionPolicy::kS3Fifo, EvictionPolicy::kPrefixAware,
                                           EvictionPolicy::kLookahead};

// One --capacities entry: what was asked, and the whole blocks it replays as.
struct Capacity {
  uint64_t requested_tokens = 0;
  uint64_t blocks = 0;
};

// Each entry a whole number of tokens (replay::parse_token_count), at least one block. One that
// is not a multiple of the block is rounded down to whole blocks, and the capacity replayed is the
// one reported (the table says so): refusing it would refuse the figures everybody quotes for
// 512-token blocks (1e6 tokens is 1953.125 of them), and reporting 1e6 for what replayed as
// 999,936 tokens would put the hit rate beside a capacity it was not measured at.
Result<std::vector<Capacity>> parse_capacities(const std::string& text, uint32_t block_tokens) {
  std::vector<Capacity> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto tokens = replay::parse_token_count(item);
    if (!tokens.ok()) return invalid_argument("--capacities: " + tokens.status().message());
    if (*tokens < block_tokens) {
      return invalid_argument("--capacities: \"" + item + "\" is less than one " +
                              std::to_string(block_tokens) + "-token block");
    }
    out.push_back({*tokens, *tokens / block_tokens});
  }
  if (out.empty()) return invalid_argument("--capacities: no capacity given");
  return out;
}

Result<std::vector<RunSpec>> parse_policies(const std::string& text) {
  std::vector<RunSpec> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    RunSpec s;
    if (item == "ref_lru") {
      s.kind = RunKind::kReferenceLru;
    } else if (item == "opt") {
      s.kind = RunKind::kBelady;
    } else if (item == "count_oracle") {
      s.kind = RunKind::kCountOracle;
    } else {
      bool found = false;
      for (EvictionPolicy p : kAllPolicies) {
        if (eviction_policy_name(p) == item) {
          s.eviction = p;
          found = true;
        }
      }
      if (!found) {
        return invalid_argument("--policies: unknown policy \"" + item +
                                "\" (lru, lfu, s3fifo, prefix_aware, lookahead, ref_lru, opt, "
                                "count_oracle)");
      }
    }
    out.push_back(s);
  }
  if (out.empty()) return invalid_argument("--policies: no policy given");
  return out;
}

std::string percent(double fraction) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << fraction * 100.0 << " %";
  return os.str();
}

double fraction(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

std::string json_number(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

// Length of the well-formed UTF-8 sequence that starts at s[i] (Unicode's table 3-7: no
// overlong forms, no surrogates, nothing past U+10FFFF); 0 when it is ill-formed.
std::size_t utf8_sequence(const std::string& s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

// A JSON string of `s`. The trace path is whatever bytes the file system holds, which need not be
// UTF-8, and JSON text must be: well-formed UTF-8 passes through, each byte of an ill-formed
// sequence becomes U+FFFD (the replacement character; a byte cannot be written in JSON, and
// a u escape of the byte value would name a different character, so a different path).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
      ++i;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
      ++i;
    } else if (const std::size_t n = utf8_sequence(s, i); n > 0) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  return out + "\"";
}

class ReplayCommand final : public Command {
 public:
  std::string_view name() const override { return "replay"; }
  std::string_view summary() const override {
    return "replay a request trace through every eviction policy, against LRU and Belady";
  }
  std::string_view description() const override {
    return "Replays a JSONL request trace (timestamp, input_length, output_length, 512-token\n"
           "hash_ids) through the page table and the eviction policies, metadata only, and\n"
           "reports the token hit rate per policy and capacity, overall and per tier, next to\n"
           "plain LRU (ref_lru), offline Belady (opt) and count_oracle (knows how often each\n"
           "block comes back, not when, and the queue). --capacities sweeps one tier;\n"
           "without it the configuration's tier capacities are used. --lookahead N lets the\n"
           "policies see the keys of the next N requests (the engine's waiting queue).";
  }
  void add_options(OptionParser& p) override {
    p.allow_positionals("TRACE", "the trace file (JSONL)", &positionals_);
    p.add_string("capacities", "LIST",
                 "single-tier sweep, whole tokens in decimal (e.g. 1e6,2.5e6,3000000); "
                 "rounded down to whole blocks",
                 &capacities_);
    p.add_uint("lookahead", "N", "requests visible ahead to the policies (default 0)", &lookahead_);
    p.add_string("policies", "LIST",
                 "subset of lru,lfu,s3fifo,prefix_aware,lookahead,ref_lru,opt,count_oracle "
                 "(default all)",
                 &policies_);
    p.add_uint("block-tokens", "N", "tokens per replay block (default model.page_tokens)",
               &block_tokens_);
    p.add_uint("threads", "N", "runs in parallel (default: every core)", &threads_);
    p.add_flag("json", "print one JSON object instead of a table", &json_);
    p.add_flag("by-distance",
               "table: hit rate by requests since each hit block's last use, not by tier",
               &by_distance_);
    p.add_flag("no-progress", "no progress bar on stderr", &no_progress_);
    p.add_string("synthetic", "KIND", "replay a generated trace instead of a file (chat, agent)",
                 &synthetic_);
    p.add_uint("synthetic-requests", "N", "requests of the generated trace (default 4000)",
               &synthetic_requests_);
    p.add_uint("seed", "N", "seed of the generated trace (default 1)", &seed_);
    p.add_string("write-trace", "PATH", "also save the generated trace as JSONL", &write_trace_);
  }

  int run(const CommandContext& ctx) override {
    // Checked before the trace is read; these are stored in 32 bits, where larger values would
    // wrap silently (2^32 + 16 block tokens would replay as 16).
    if (lookahead_ > std::numeric_limits<uint32_t>::max()) {
      ctx.err << "kvtier-bench replay: --lookahead " << lookahead_ << " is more than "
              << std::numeric_limits<uint32_t>::max() << " requests\n";
      return kExitUsage;
    }
    if (block_tokens_ != 0 && replay::kTraceBlockTokens % block_tokens_ != 0) {
      ctx.err << "kvtier-bench replay: --block-tokens " << block_tokens_
              << " does not divide the trace's " << replay::kTraceBlockTokens << "-token blocks\n";
      return kExitUsage;
    }
    if (threads_ > std::numeric_limits<uint32_t>::max()) {
      ctx.err << "kvtier-bench replay: --threads " << threads_ << " is more than "
              << std::numeric_limits<uint32_t>::max() << "\n";
      return kExitUsage;
    }

    const Geometry& g = ctx.config.model.geometry;
    const uint32_t block_tokens =  // at most 512, checked above
        block_tokens_ != 0 ? static_cast<uint32_t>(block_tokens_) : g.page_tokens;
    std::vector<Capacity> capacities;
    if (!capacities_.empty()) {  // checked before the trace is read, too
      auto caps = parse_capacities(capacities_, block_tokens);
      if (!caps.ok()) {
        ctx.err << "kvtier-bench replay: " << caps.status().message() << "\n";
        return kExitUsage;
      }
      capacities = std::move(*caps);
    }

    replay::Trace trace;
    if (!synthetic_.empty()) {
      if (synthetic_ == "chat") {
        replay::ChatTraceOptions o;
        o.requests = synthetic_requests_;
        o.seed = seed_;
        trace = replay::generate_chat_trace(o);
      } else if (synthetic_ == "agent") {
        replay::AgentTraceOptions o;
        o.requests = synthetic_requests_;
        o.seed = seed_;
        trace = replay::generate_agent_trace(o);
      } else {
        ctx.err << "kvtier-bench replay: unknown --synthetic kind \"" << synthetic_
                << "\" (chat, agent)\n";
        return kExitUsage;
      }
      if (!write_trace_.empty()) {
        std::ofstream f(write_trace_);
        for (const auto& r : trace.requests) f << replay::format_trace_line(r) << "\n";
        if (!f) {
          ctx.err << "kvtier-bench replay: cannot write " << write_trace_ << "\n";
          return kExitFailure;
        }
      }
    } else {
      if (positionals_.size() != 1) {
        ctx.err << "kvtier-bench replay: give exactly one trace file (or --synthetic chat|agent)\n";
        return kExitUsage;
      }
      auto loaded = replay::load_trace(positionals_[0]);
      if (!loaded.ok()) {
        ctx.err << "kvtier-bench replay: " << loaded.status().message() << "\n";
        return loaded.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
      }
      trace = std::move(*loaded);
    }
    if (trace.requests.empty()) {  // a file without requests is refused by load_trace already
      ctx.err << "kvtier-bench replay: " << trace.source << ": no requests\n";
      return kExitUsage;
    }

    auto workload = replay::build_workload(trace, block_tokens);
    if (!workload.ok()) {
      ctx.err << "kvtier-bench replay: " << workload.status().message() << "\n";
      return kExitUsage;
    }
    auto policies = parse_policies(policies_);
    if (!policies.ok()) {
      ctx.err << "kvtier-bench replay: " << policies.status().message() << "\n";
      return kExitUsage;
    }

    // The runs: every policy at every capacity. Reported: the capacity replayed, whole blocks.
    std::vector<RunSpec> specs;
    std::vector<uint64_t> requested;  // per spec, the tokens asked for
    std::array<uint64_t, kNumTiers> tier_tokens{};
    if (!capacities_.empty()) {
      for (const Capacity& c : capacities) {
        for (RunSpec s : *policies) {
          s.capacity_blocks = {c.blocks, 0, 0};
          s.capacity_tokens = c.blocks * block_tokens;
          specs.push_back(s);
          requested.push_back(c.requested_tokens);
        }
      }
    } else {
      // Bytes of KV per token across all layers: a block is page_tokens tokens.
      const double per_token = static_cast<double>(g.block_bytes()) / g.page_tokens;
      const auto tokens_of = [&](uint64_t bytes) {
        return static_cast<uint64_t>(static_cast<double>(bytes) / per_token);
      };
      const TiersConfig& t = ctx.config.tiers;
      const std::array<uint64_t, kNumTiers> configured = {
          tokens_of(t.hbm.capacity_bytes), tokens_of(t.host.capacity_bytes),
          t.nvme.enabled ? tokens_of(t.nvme.capacity_bytes) : 0};
      for (RunSpec s : *policies) {
        uint64_t total = 0;
        uint64_t asked = 0;
        for (std::size_t i = 0; i < kNumTiers; ++i) {
          s.capacity_blocks[i] = configured[i] / block_tokens;
          tier_tokens[i] = s.capacity_blocks[i] * block_tokens;
          total += tier_tokens[i];
          asked += configured[i];
        }
        s.capacity_tokens = total;
        specs.push_back(s);
        requested.push_back(asked);
      }
    }

    replay::RunOptions options;
    options.lookahead = static_cast<uint32_t>(lookahead_);  // in range, checked above
    options.write = ctx.config.policies.write;
    options.write_selective_hits = ctx.config.policies.write_selective_hits;
    options.nvme_min_hits = ctx.config.policies.admission.nvme_min_hits;

    // One slot per run, empty until its thread fills it (an error put in every slot beforehand
    // would be an unchecked Status overwritten by each result).
    std::vector<std::optional<Result<RunResult>>> slots(specs.size());
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> finished{0};
    std::atomic<uint64_t> progress{0};
    const uint64_t work = specs.size() * workload->requests();
    const unsigned threads = static_cast<unsigned>(
        threads_ != 0 ? threads_ : std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned i = 0; i < std::min<std::size_t>(threads, specs.size()); ++i) {
      pool.emplace_back([&] {
        for (std::size_t k; (k = next.fetch_add(1)) < specs.size();) {
          // run_replay returns every failure as a Status; this catches what would escape it
          // anyway (the copy of a result), since an exception ending a thread ends the process.
          try {
            slots[k].emplace(replay::run_replay(*workload, specs[k], options, &progress));
          } catch (const std::exception& e) {
            slots[k].emplace(internal_error(std::string("exception: ") + e.what()));
          } catch (...) {
            slots[k].emplace(internal_error("unknown exception"));
          }
          finished.fetch_add(1);
        }
      });
    }
    if (!no_progress_) {
      while (finished.load() < specs.size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        const double f = work == 0 ? 1.0 : static_cast<double>(progress.load()) / work;
        const int bars = static_cast<int>(f * 30);
        ctx.err << "\rreplay [" << std::string(bars, '#') << std::string(30 - bars, ' ') << "] "
                << std::setw(3) << static_cast<int>(f * 100) << "% " << finished.load() << "/"
                << specs.size() << " runs" << std::flush;
      }
      ctx.err << "\n";
    }
    for (auto& th : pool) th.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<RunResult> results;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      if (!slots[k].has_value() || !slots[k]->ok()) {
        ctx.err << "kvtier-bench replay: " << specs[k].policy_name() << " at "
                << specs[k].capacity_tokens << " tokens failed: "
                << (slots[k].has_value() ? slots[k]->status().message() : "the run did not finish")
                << "\n";
        return kExitFailure;
      }
      results.push_back(std::move(**slots[k]));
    }

    if (json_) {
      print_json(ctx.out, trace.source, *workload, results, requested);
    } else {
      print_table(ctx.out, trace, *workload, tier_tokens, capacities, results, seconds);
    }
    return kExitOk;
  }

 private:
  // capacity_tokens: the capacity replayed; requested_tokens: the one asked for (more when it
  // was not a whole number of blocks).
  // hit_rate_by_reuse_distance: fractions of prompt tokens, by bucket name (workload.hpp);
  // reusable_*: what a cache that never evicts hits.
  void print_json(std::ostream& os, const std::string& source, const replay::ReplayWorkload& w,
                  const std::vector<RunResult>& results,
                  const std::vector<uint64_t>& requested) const {
    const auto by_distance =
        [&](const std::array<uint64_t, replay::kReuseDistanceBuckets>& tokens) {
          std::string out = "{";
          for (std::size_t b = 0; b < tokens.size(); ++b) {
            out += (b ? ", \"" : "\"") + std::string(replay::kReuseDistanceNames[b]) +
                   "\": " + json_number(fraction(tokens[b], w.total_input_tokens));
          }
          return out + "}";
        };
    os << "{\"trace\": " << json_string(source) << ", \"lookahead\": " << lookahead_
       << ", \"block_tokens\": " << w.block_tokens << ", \"reusable_hit_rate\": "
       << json_number(fraction(w.reusable.tokens, w.total_input_tokens))
       << ", \"reusable_by_reuse_distance\": " << by_distance(w.reusable.by_distance)
       << ", \"results\": [";
    for (std::size_t k = 0; k < results.size(); ++k) {
      const RunResult& r = results[k];
      os << (k ? ", " : "") << "{\"policy\": " << json_string(r.policy)
         << ", \"capacity_tokens\": " << r.capacity_tokens
         << ", \"hit_rate\": " << json_number(r.hit_rate())
         << ", \"requested_tokens\": " << requested[k] << ", \"hit_rate_by_tier\": {";
      for (Tier t : kAllTiers) {
        os << (t == Tier::kHbm ? "" : ", ") << "\"" << tier_name(t)
           << "\": " << (r.by_tier ? json_number(r.tier_hit_rate(t)) : "null");
      }
      os << "}, \"hit_rate_by_reuse_distance\": " << by_distance(r.hit_tokens_by_distance) << "}";
    }
    os << "]}\n";
  }

  void print_table(std::ostream& os, const replay::Trace& trace, const replay::ReplayWorkload& w,
                   const std::array<uint64_t, kNumTiers>& tiers,
                   const std::vector<Capacity>& capacities, const std::vector<RunResult>& results,
                   double seconds) const {
    os << "trace     " << trace.source << ": " << w.requests() << " requests, "
       << w.total_input_tokens << " prompt tokens, " << w.unique_blocks << " unique "
       << w.block_tokens << "-token blocks\n";
    os << "lookahead " << lookahead_ << " requests\n";
    for (const Capacity& c : capacities) {
      if (c.blocks * w.block_tokens == c.requested_tokens) continue;
      os << "capacity  " << c.requested_tokens << " tokens is not a whole number of "
         << w.block_tokens << "-token blocks: replayed as " << c.blocks
         << (c.blocks == 1 ? " block, " : " blocks, ") << c.blocks * w.block_tokens << " tokens\n";
    }
    if (capacities_.empty()) {
      os << "tiers     hbm " << tiers[0] << ", host " << tiers[1] << ", nvme " << tiers[2]
         << " tokens (from the configuration)\n";
    }
    if (by_distance_) {
      os << "reuse     a cache that never evicts hits "
         << percent(fraction(w.reusable.tokens, w.total_input_tokens))
         << "; columns: hits by requests since the block's last use\n";
    }
    os << "\n"
       << std::left << std::setw(14) << "policy" << std::right << std::setw(16) << "capacity(tok)"
       << std::setw(10) << "hit rate";
    if (by_distance_) {
      for (std::string_view name : replay::kReuseDistanceNames) os << std::setw(10) << name;
      os << "\n"
         << std::left << std::setw(14) << "(never evicts)" << std::right << std::setw(16) << "-"
         << std::setw(10) << percent(fraction(w.reusable.tokens, w.total_input_tokens));
      for (uint64_t t : w.reusable.by_distance) {
        os << std::setw(10) << percent(fraction(t, w.total_input_tokens));
      }
    } else {
      os << std::setw(10) << "hbm" << std::setw(10) << "host" << std::setw(10) << "nvme";
    }
    os << "\n";
    uint64_t last_capacity = ~uint64_t{0};
    for (const RunResult& r : results) {
      if (r.capacity_tokens != last_capacity && last_capacity != ~uint64_t{0}) os << "\n";
      last_capacity = r.capacity_tokens;
      os << std::left << std::setw(14) << r.policy << std::right << std::setw(16)
         << r.capacity_tokens << std::setw(10) << percent(r.hit_rate());
      if (by_distance_) {
        for (std::size_t b = 0; b < replay::kReuseDistanceBuckets; ++b) {
          os << std::setw(10) << percent(r.distance_hit_rate(b));
        }
      } else {
        for (Tier t : kAllTiers) {
          os << std::setw(10) << (r.by_tier ? percent(r.tier_hit_rate(t)) : "-");
        }
      }
      os << "\n";
    }
    os << "\n"
       << results.size() << " runs in " << std::fixed << std::setprecision(1) << seconds << " s\n";
  }

  std::vector<std::string> positionals_;
  std::string capacities_;
  uint64_t lookahead_ = 0;
  std::string policies_ = "lru,lfu,s3fifo,prefix_aware,lookahead,ref_lru,opt,count_oracle";
  uint64_t block_tokens_ = 0;
  uint64_t threads_ = 0;
  bool json_ = false;
  bool by_distance_ = false;
  bool no_progress_ = false;
  std::string synthetic_;
  uint64_t synthetic_requests_ = 4000;
  uint64_t seed_ = 1;
  std::string write_trace_;
};

}  // namespace

std::unique_ptr<Command> make_replay_command() { return std::make_unique<ReplayCommand>(); }

}  // namespace kvtier::bench
