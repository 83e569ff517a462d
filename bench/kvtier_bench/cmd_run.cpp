// `kvtier-bench run`: the long-context benchmark. One workload through four configurations of the
// cache side by side — recompute, hbm_lru, hbm_host, kvtier (bench/run/baseline.hpp) — on a
// modeled GPU server in virtual time (--clock virtual, the default: bench/run/sim_engine.hpp), or
// with real bytes through the real tiers and CPU attention (--clock real:
// bench/run/real_engine.hpp). With no options it runs the default: the `mix` workload on the H200
// preset with Llama-3.1-8B and the configuration's policies for kvtier, a run of a few minutes on
// two cores (`make run`). Baselines run on threads of their own (--jobs); progress goes to stderr,
// the result to stdout as a table, or JSON (--json) or CSV (--csv); --plot draws hit rates and TTFT
// with gnuplot. --metrics HOST:PORT serves the kvtier baseline's Prometheus metrics while it runs
// (and --metrics-hold seconds after), as an embedded Runtime would.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <iomanip>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/kvtier_bench/command.hpp"
#include "bench/run/baseline.hpp"
#include "bench/run/perf_model.hpp"
#include "bench/run/presets.hpp"
#include "bench/run/progress.hpp"
#include "bench/run/real_engine.hpp"
#include "bench/run/report.hpp"
#include "bench/run/sim_engine.hpp"
#include "bench/run/workload.hpp"
#include "runtime/config_describe.hpp"
#include "runtime/config_size.hpp"
#include "runtime/config_validate.hpp"
#include "scheduler/policies/evictor.hpp"

namespace kvtier::bench {
namespace {

using namespace kvtier::bench::run;  // NOLINT(google-build-using-namespace): this file is its CLI

// Bounds of options that would otherwise wrap or overflow. Real engines page 16 to 256 tokens.
constexpr uint64_t kMaxPageTokens = 65536;
constexpr uint64_t kMaxLayerGroup = 4096;  // beyond any model's layer count
constexpr double kMaxMetricsHoldS = 86400;

struct RunOptions {
  std::string clock = "virtual";
  std::string workload = "mix";
  std::string params;
  std::string trace;
  double time_scale = 1.0;
  uint64_t max_requests = 0;
  std::string gpu = "h200";
  std::string model = "llama-3.1-8b";
  std::string baselines;
  uint64_t seed = 1;
  uint64_t page_tokens = 0;
  uint64_t layer_group = 0;
  uint64_t hbm = 0;
  uint64_t host = 0;
  uint64_t nvme = 0;
  uint64_t jobs = 0;
  bool json = false;
  bool csv = false;
  std::string plot;
  bool no_progress = false;
  std::string metrics;  // serve the kvtier baseline's metrics here
  double metrics_hold = 0;
  uint64_t audit = 0;  // check invariants every N events (virtual clock)
  // --clock real
  double link_factor = 2.0;
  uint64_t real_requests = 0;
};

std::string describe_policies(const PoliciesConfig& p) {
  std::ostringstream s;
  s << "eviction " << eviction_policy_name(p.eviction) << ", write "
    << (p.write == WritePolicy::kWriteThrough ? "write_through"
        : p.write == WritePolicy::kWriteBack  ? "write_back"
                                              : "write_through_selective")
    << ", prefetch depth " << p.prefetch.depth << ", layer window " << p.prefetch.layer_window
    << ", on_late " << (p.prefetch.on_late == LatePolicy::kStall ? "stall" : "recompute")
    << ", nvme_min_hits " << p.admission.nvme_min_hits;
  return s.str();
}

std::string gb(double bytes) { return human_bytes(bytes); }

class RunCommand final : public Command {
 public:
  std::string_view name() const override { return "run"; }
  std::string_view summary() const override {
    return "long-context benchmark: workloads through recompute, hbm_lru, hbm_host and kvtier";
  }
  std::string_view description() const override {
    return "Runs one workload through four configurations of the KV cache on the same server and\n"
           "prints, per configuration, TTFT and TPOT percentiles, throughput, hit rate per tier,\n"
           "bytes per link, stalls, prefetch timeliness and compute-or-load decisions:\n"
           "  recompute  no reuse (prefix caching off), HBM only\n"
           "  hbm_lru    HBM-only prefix cache, LRU (a serving engine's built-in prefix cache)\n"
           "  hbm_host   HBM + host memory, LRU, no hints (host-memory offloading connectors)\n"
           "  kvtier     HBM + host + NVMe with the configuration's policies and hints\n"
           "--clock virtual (default) models a GPU server (--gpu, --model presets from\n"
           "configs/bench/) in virtual time, kvtier's real scheduler and policies making every\n"
           "decision. --clock real moves real bytes through the real tiers (emulated HBM, host\n"
           "pool, NVMe store) with CPU attention at a small geometry, and measures how much of\n"
           "the transfer time compute hid.\n\n"
           "workloads (--workload, parameters with --params NAME=V,...):\n"
           "  mix           chat, agent and docs in one arrival stream (default): about an\n"
           "                hour of traffic; parameters of the parts prefixed (docs.rate=0.4);\n"
           "                defaults chat.users=200 chat.rate=0.12 chat.think_s=60\n"
           "                agent.agents=40 agent.rate=0.02 agent.steps=15 agent.tool_s=4\n"
           "                docs.documents=100 docs.doc_tokens=32000 docs.questions=800\n"
           "                docs.rate=0.4 docs.zipf=0.7\n"
           "  chat          users=160 rate=1 system_prompts=4 system_tokens=2000 turns=6\n"
           "                message_tokens=400 answer_tokens=300 think_s=30\n"
           "  agent         agents=48 rate=0.4 system_tokens=12000 task_tokens=800 steps=12\n"
           "                action_tokens=150 observation_tokens=1500 tool_s=3\n"
           "  docs          documents=40 doc_tokens=40000 questions=600 rate=2 zipf=0.8\n"
           "                system_tokens=500 question_tokens=60 answer_tokens=200\n"
           "  long_context  context=1000000 questions=2 question_tokens=100 answer_tokens=64\n"
           "                gap_s=30 hbm_fraction=0.2 (HBM KV = that share of the context's KV)\n"
           "  trace         --trace PATH (JSONL: timestamp, input_length, output_length, "
           "hash_ids)\n"
           "parameter bounds: users, agents, documents 1..100000; system_prompts 1..10000;\n"
           "questions 1..1000000 (docs), 1..10000 (long_context); token lengths 1..10000000;\n"
           "rate 0.001..1000000 per second; turns, steps 1..1000; think_s, tool_s 0..3600;\n"
           "gap_s 0..86400; zipf 0..10; hbm_fraction (0, 1]; and at most 2 GiB of requests and\n"
           "block keys in all.";
  }

  void add_options(OptionParser& p) override {
    p.add_string("clock", "virtual|real", "modeled GPU server in virtual time, or real tiers",
                 &o_.clock);
    p.add_string("workload", "NAME", "mix (default), chat, agent, docs, long_context, trace",
                 &o_.workload);
    p.add_string("params", "LIST", "workload parameters, e.g. users=64,turns=6", &o_.params);
    p.add_string("trace", "PATH", "replay a JSONL trace (sets --workload trace)", &o_.trace);
    p.add_double("time-scale", "X", "trace: multiply arrival times by X (default 1)",
                 &o_.time_scale);
    p.add_uint("max-requests", "N", "trace: replay only the first N requests", &o_.max_requests);
    p.add_string("gpu", "NAME|FILE", "GPU preset: h200 (default), h100, or a YAML file", &o_.gpu);
    p.add_string("model", "NAME|FILE",
                 "model preset: llama-3.1-8b (default), llama-3.1-70b, or a YAML file", &o_.model);
    p.add_string("baselines", "LIST", "recompute,hbm_lru,hbm_host,kvtier (default: all)",
                 &o_.baselines);
    p.add_uint("seed", "N", "workload seed (default 1)", &o_.seed);
    p.add_uint("page-tokens", "N",
               "tokens per simulated page, at most 65536 (default: the preset's)", &o_.page_tokens);
    p.add_uint("layer-group", "N",
               "model layers per simulated layer, dividing the layers (default: the preset's)",
               &o_.layer_group);
    p.add_size("hbm", "SIZE", "HBM for KV (default: HBM - weights - reserved)", &o_.hbm);
    p.add_size("host", "SIZE", "host memory for KV (default: the preset's)", &o_.host);
    p.add_size("nvme", "SIZE", "NVMe for KV (default: the preset's)", &o_.nvme);
    p.add_uint("jobs", "N", "baselines run at once (default: the cores, at most 4)", &o_.jobs);
    p.add_flag("json", "print one JSON object instead of the table", &o_.json);
    p.add_flag("csv", "print CSV (one row per baseline) instead of the table", &o_.csv);
    p.add_string("plot", "PNG", "also draw hit rate and TTFT per baseline (gnuplot)", &o_.plot);
    p.add_flag("no-progress", "no progress bar on stderr", &o_.no_progress);
    p.add_string("metrics", "HOST:PORT",
                 "serve the kvtier baseline's Prometheus metrics there while it runs", &o_.metrics);
    p.add_double("metrics-hold", "S",
                 "keep serving them S seconds (at most 86400) after the run (default 0)",
                 &o_.metrics_hold);
    p.add_uint("audit", "N",
               "virtual: check kvtier's invariants after every Nth event of the simulated loop "
               "and fail at the first broken one (slow: for testing)",
               &o_.audit);
    p.add_double("link-factor", "X",
                 "real: throttle the host->HBM link to X > 0 times the measured demand "
                 "(default 2)",
                 &o_.link_factor);
    p.add_uint("real-requests", "N", "real: requests of the workload to run (default 24)",
               &o_.real_requests);
  }

  int run(const CommandContext& ctx) override {
    if (o_.json && o_.csv) return usage(ctx, "--json and --csv are exclusive");
    if (!o_.trace.empty()) o_.workload = "trace";
    if (o_.clock != "virtual" && o_.clock != "real") {
      return usage(ctx, "--clock must be virtual or real, not \"" + o_.clock + "\"");
    }
    auto params = parse_workload_params(o_.params);
    if (!params.ok()) return usage(ctx, params.status().message());
    if (o_.workload == "trace" && o_.trace.empty()) {
      return usage(ctx, "--workload trace needs --trace PATH");
    }
    if (Status s = check_metrics_options(ctx.config); !s.ok()) return usage(ctx, s.message());
    if (Status s = check_numeric_options(); !s.ok()) return usage(ctx, s.message());
    // Before the run, not after it: a plot that cannot be written should not cost the run.
    if (!o_.plot.empty()) {
      if (Status s = check_plot_path(o_.plot); !s.ok()) {
        ctx.err << "kvtier-bench run: " << s.message() << "\n";
        return s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
      }
    }
    Result<RunReport> report =
        o_.clock == "virtual" ? run_virtual_clock(ctx, *params) : run_real_clock(ctx, *params);
    if (!report.ok()) {
      const StatusCode c = report.status().code();
      ctx.err << "kvtier-bench run: " << report.status().message() << "\n";
      return c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound ? kExitUsage
                                                                             : kExitFailure;
    }
    if (o_.json) {
      print_json(ctx.out, *report);
    } else if (o_.csv) {
      print_csv(ctx.out, *report);
    } else {
      print_table(ctx.out, *report);
    }
    if (!o_.plot.empty()) {
      Status s = write_plot(o_.plot, *report);
      if (!s.ok()) {
        ctx.err << "kvtier-bench run: " << s.message() << "\n";
        return kExitFailure;
      }
      ctx.err << "plot written to " << o_.plot << "\n";
    }
    return kExitOk;
  }

 private:
  int usage(const CommandContext& ctx, const std::string& msg) {
    ctx.err << "kvtier-bench run: " << msg << "\n";
    return kExitUsage;
  }

  // --metrics is an address as metrics.listen takes it; --metrics-hold a time in [0, a day].
  Status check_metrics_options(const Config& config) const {
    if (!(o_.metrics_hold >= 0) || !(o_.metrics_hold <= kMaxMetricsHoldS)) {
      return invalid_argument("--metrics-hold must be a number of seconds from 0 to 86400");
    }
    if (o_.metrics.empty()) {
      if (o_.metrics_hold > 0) return invalid_argument("--metrics-hold needs --metrics HOST:PORT");
      return ok_status();
    }
    Config c = config;
    c.metrics.listen = o_.metrics;
    for (const ConfigIssue& issue : find_config_issues(c)) {
      if (issue.keys.front() == "metrics.listen")
        return invalid_argument("--metrics: " + issue.message);
    }
    return ok_status();
  }

  // Options that would otherwise be truncated to 32 bits or clamped without a word.
  Status check_numeric_options() const {
    if (o_.page_tokens > kMaxPageTokens) {
      return invalid_argument("--page-tokens " + std::to_string(o_.page_tokens) +
                              " is too large: at most " + std::to_string(kMaxPageTokens) +
                              " tokens per page");
    }
    if (o_.layer_group > kMaxLayerGroup) {
      return invalid_argument("--layer-group " + std::to_string(o_.layer_group) +
                              " is too large: it must divide the model's layers (at most " +
                              std::to_string(kMaxLayerGroup) + ")");
    }
    if (o_.audit > 0 && o_.clock != "virtual") {
      return invalid_argument("--audit checks the simulated loop: it needs --clock virtual");
    }
    if (!(o_.link_factor > 0)) {
      return invalid_argument(
          "--link-factor must be > 0 (the link's bandwidth as a multiple of "
          "the measured demand), not " +
          format_number(o_.link_factor));
    }
    return ok_status();
  }

  static std::string format_number(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }

  // The metrics the kvtier baseline serves (--metrics), with the configuration's buckets.
  MetricsConfig metrics_config(const Config& config) const {
    MetricsConfig m = config.metrics;
    m.listen = o_.metrics;
    return m;
  }

  // Says where the kvtier baseline's metrics are served, or why --metrics cannot apply.
  Status announce_metrics(const CommandContext& ctx, const std::vector<BaselineSpec>& specs) {
    if (o_.metrics.empty()) return ok_status();
    const bool has_kvtier = std::any_of(specs.begin(), specs.end(), [](const BaselineSpec& b) {
      return b.kind == BaselineKind::kKvtier;
    });
    if (!has_kvtier) {
      return invalid_argument(
          "--metrics serves the kvtier baseline's metrics; add kvtier to "
          "--baselines");
    }
    ctx.err << "kvtier-bench run: the kvtier baseline serves its metrics at http://" << o_.metrics
            << "/metrics";
    if (o_.metrics_hold > 0) ctx.err << " (and for " << o_.metrics_hold << " s after its run)";
    ctx.err << "\n";
    return ok_status();
  }

  Result<Workload> build_workload(const WorkloadParams& params, uint32_t page_tokens) {
    if (o_.workload == "trace") {
      if (!params.empty()) return invalid_argument("--params does not apply to a trace");
      return load_trace_workload(o_.trace, o_.time_scale, o_.max_requests, page_tokens);
    }
    return generate_workload(o_.workload, params, o_.seed, page_tokens);
  }

  // Runs every baseline of `specs` with `fn(i, progress)` on up to --jobs threads.
  template <typename Fn>
  std::vector<Result<BaselineResult>> run_all(const CommandContext& ctx,
                                              const std::vector<BaselineSpec>& specs,
                                              uint64_t requests, Fn fn) {
    std::vector<std::string> names;
    for (const BaselineSpec& s : specs) names.push_back(s.name);
    ProgressBar bar(ctx.err, !o_.no_progress, names, requests);
    // One slot per baseline, empty until its thread fills it (an error put in every slot beforehand
    // would be an unchecked Status overwritten by each result).
    std::vector<std::optional<Result<BaselineResult>>> slots(specs.size());
    std::atomic<std::size_t> next{0};
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::size_t jobs =
        std::clamp<std::size_t>(o_.jobs > 0 ? o_.jobs : std::min(cores, 4u), 1, specs.size());
    bar.start();
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < jobs; ++t) {
      threads.emplace_back([&] {
        for (std::size_t i = next++; i < specs.size(); i = next++) {
          // An exception must not leave a thread (std::terminate): it becomes this baseline's
          // error.
          try {
            slots[i].emplace(fn(i, bar.counter(i)));
          } catch (const std::bad_alloc&) {
            slots[i].emplace(
                resource_exhausted(specs[i].name + ": out of memory (std::bad_alloc)"));
          } catch (const std::exception& e) {
            slots[i].emplace(internal_error(specs[i].name + ": " + e.what()));
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    bar.stop();
    std::vector<Result<BaselineResult>> results;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      results.push_back(slots[i].has_value() ? std::move(*slots[i])
                                             : internal_error(specs[i].name + ": not run"));
    }
    return results;
  }

  Result<RunReport> run_virtual_clock(const CommandContext& ctx, const WorkloadParams& params) {
    KVTIER_ASSIGN_OR_RETURN(GpuPreset gpu, load_gpu_preset(o_.gpu));
    KVTIER_ASSIGN_OR_RETURN(ModelPreset model_preset, load_model_preset(o_.model));
    // In range (check_numeric_options); a group that does not divide the layers is the flag's
    // fault, not the preset's.
    if (o_.page_tokens > 0) gpu.page_tokens = static_cast<uint32_t>(o_.page_tokens);
    if (o_.layer_group > 0) {
      if (model_preset.layers % o_.layer_group != 0) {
        return invalid_argument("--layer-group " + std::to_string(o_.layer_group) +
                                " must divide the " + std::to_string(model_preset.layers) +
                                " layers of " + model_preset.name);
      }
      gpu.layer_group = static_cast<uint32_t>(o_.layer_group);
    }
    KVTIER_ASSIGN_OR_RETURN(PerfModel model, PerfModel::create(gpu, model_preset));
    KVTIER_ASSIGN_OR_RETURN(Workload workload, build_workload(params, gpu.page_tokens));
    if (workload.requests.empty()) return invalid_argument("the workload has no requests");
    KVTIER_ASSIGN_OR_RETURN(auto specs, make_baselines(o_.baselines, ctx.config.policies,
                                                       model.prefill_tokens_per_s()));
    KVTIER_RETURN_IF_ERROR(announce_metrics(ctx, specs));
    VirtualRunOptions vo;
    vo.hbm_kv_bytes = o_.hbm > 0 ? o_.hbm : model.hbm_kv_bytes();
    vo.host_bytes = o_.host > 0 ? o_.host : gpu.host_kv_bytes;
    vo.nvme_bytes = o_.nvme > 0 ? o_.nvme : gpu.nvme_bytes;
    vo.host_kv_dtype = ctx.config.tiers.host.kv_dtype;
    vo.nvme_kv_dtype = ctx.config.tiers.nvme.kv_dtype;
    vo.watermarks = {ctx.config.tiers.hbm.watermarks, ctx.config.tiers.host.watermarks,
                     ctx.config.tiers.nvme.watermarks};
    vo.audit_every = o_.audit;
    const uint64_t longest_kv = workload.max_request_tokens() * model.kv_bytes_per_token();
    if (workload.hbm_kv_fraction > 0 && o_.hbm == 0) {
      vo.hbm_kv_bytes = std::min<uint64_t>(
          vo.hbm_kv_bytes,
          static_cast<uint64_t>(workload.hbm_kv_fraction * static_cast<double>(longest_kv)));
    }

    RunReport r;
    r.clock = "virtual";
    r.config_source =
        ctx.config_source + " (kvtier: " + describe_policies(ctx.config.policies) + ")";
    r.gpu = gpu.name + " (" + gpu.source + ")";
    r.model = model_preset.name + " (" + model_preset.source + ")";
    r.seed = o_.seed;
    describe_workload(r, workload);
    r.kv_bytes_per_token = model.kv_bytes_per_token();
    r.page_tokens = gpu.page_tokens;
    r.layers = model_preset.layers;
    r.layer_group = gpu.layer_group;
    std::ostringstream n1, n2, n3;
    n1 << "tiers: HBM " << gb(static_cast<double>(vo.hbm_kv_bytes)) << " for KV ("
       << gb(static_cast<double>(gpu.hbm_bytes)) << " - weights "
       << gb(static_cast<double>(model.weight_bytes())) << " - reserved "
       << gb(static_cast<double>(gpu.reserved_bytes))
       << (vo.hbm_kv_bytes < model.hbm_kv_bytes() ? ", capped" : "") << "), host "
       << gb(static_cast<double>(vo.host_bytes)) << ", NVMe "
       << gb(static_cast<double>(vo.nvme_bytes)) << "; KV "
       << gb(static_cast<double>(model.kv_bytes_per_token())) << "/token";
    if (longest_kv > vo.hbm_kv_bytes) {
      n1 << "; HBM holds " << std::fixed << std::setprecision(1)
         << 100.0 * static_cast<double>(vo.hbm_kv_bytes) / static_cast<double>(longest_kv)
         << " % of the longest request's KV";
    }
    n2 << "links: PCIe " << gb(gpu.pcie_bandwidth * gpu.pcie_efficiency)
       << "/s each way, NVMe read " << gb(gpu.nvme_read_bandwidth * gpu.nvme_efficiency)
       << "/s, write " << gb(gpu.nvme_write_bandwidth * gpu.nvme_efficiency) << "/s; roofline "
       << std::fixed << std::setprecision(0) << model.achieved_flops() / 1e12 << " TFLOP/s, "
       << gb(model.achieved_hbm_bandwidth()) << "/s HBM; prefill " << std::setprecision(1)
       << model.prefill_tokens_per_s() / 1e3 << "k tokens/s (compute-or-load)";
    n3 << "simulation: " << gpu.page_tokens << "-token pages, " << model.sim_geometry().layers
       << " simulated layers of " << gpu.layer_group << ", iterations of " << gpu.max_batched_tokens
       << " tokens, up to " << gpu.max_step_iterations << " iterations per scheduler step";
    r.notes = {n1.str(), n2.str(), n3.str()};

    auto results = run_all(ctx, specs, workload.requests.size(),
                           [&](std::size_t i, std::atomic<uint64_t>* progress) {
                             VirtualRunOptions mine = vo;
                             mine.progress = progress;
                             if (specs[i].kind == BaselineKind::kKvtier) {
                               mine.metrics = metrics_config(ctx.config);
                               mine.metrics_hold_s = o_.metrics_hold;
                             }
                             return run_virtual(workload, specs[i], model, mine);
                           });
    for (auto& res : results) {
      if (!res.ok()) return res.status();
      r.baselines.push_back(std::move(res).value());
    }
    return r;
  }

  Result<RunReport> run_real_clock(const CommandContext& ctx, const WorkloadParams& params) {
    RealRunOptions ro;
    ro.link_factor = o_.link_factor;
    ro.max_requests = o_.real_requests;
    ro.seed = o_.seed;
    ro.workload = o_.workload;
    ro.params = params;
    ro.trace = o_.trace;
    ro.time_scale = o_.time_scale;
    ro.show_progress = !o_.no_progress;
    ro.hbm_bytes = o_.hbm;
    ro.host_bytes = o_.host;
    ro.nvme_bytes = o_.nvme;
    ro.metrics_listen = o_.metrics;
    ro.metrics_hold_s = o_.metrics_hold;
    // The real clock measures loads hidden behind compute: by default the baselines that load.
    KVTIER_ASSIGN_OR_RETURN(
        auto specs, make_baselines(o_.baselines.empty() ? "hbm_host,kvtier" : o_.baselines,
                                   ctx.config.policies, ctx.config.policies.prefill_tokens_per_s));
    KVTIER_RETURN_IF_ERROR(announce_metrics(ctx, specs));
    return run_real(ctx.config, ctx.config_source, specs, ro, ctx.err);
  }

  RunOptions o_;
};

}  // namespace

std::unique_ptr<Command> make_run_command() { return std::make_unique<RunCommand>(); }

}  // namespace kvtier::bench
