// The outputs of `kvtier-bench run`: a table on stdout (baselines as columns, then what each tier
// bought), one JSON object (--json), CSV (--csv, one row per baseline) and a PNG plot of hit rate
// per tier and TTFT per baseline (--plot, drawn by gnuplot).
//
// JSON shape: {"clock", "gpu", "model", "config", "seed", "workload": {...}, "tiers": {...},
// "baselines": [{"name", "mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
// "mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "requests_per_s",
// "output_tokens_per_s", "total_tokens_per_s", "hit_rate": {"hbm", "host", "nvme", "total"},
// "stall_fraction", ... kvtier's own counters, "ttft_ms_by_part": {"<part>": {"count", "mean",
// "p50", "p90", "p99"}}}], "comparison": {...}} — key names as common
// serving benchmarks spell them (TTFT/TPOT in ms, throughput per second), plus kvtier's own.
// Numbers are finite (a ratio with a zero denominator is null). Pure formatting; the plot runs one
// gnuplot process (no shell, its stdout discarded) and reports its failure as a Status.
//
// A workload of several parts (mix: chat, agent, docs) also gets TTFT per part: in the table and
// the CSV its mean and median, in the JSON its summary. A percentile over the whole mix can hide
// or invent a change: where one part's latencies are bimodal, the mix's median moves with the
// share of that part's requests on either side of the gap.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench/run/results.hpp"
#include "bench/run/workload.hpp"
#include "kvtier/status.hpp"

namespace kvtier::bench::run {

struct RunReport {
  std::string clock;          // "virtual" | "real"
  std::string config_source;  // where the kvtier configuration came from
  std::string gpu;            // preset name and source (virtual), or the machine (real)
  std::string model;
  uint64_t seed = 0;
  // Workload.
  std::string workload;
  std::string workload_description;
  uint64_t requests = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t longest_request_tokens = 0;
  std::vector<std::string> parts;  // Workload::kinds: the names RequestRecord::kind indexes
  uint64_t kv_bytes_per_token = 0;
  // Simulation or runtime shape.
  uint32_t page_tokens = 0;
  uint32_t layers = 0;             // model layers
  uint32_t layer_group = 1;        // model layers per simulated layer
  std::vector<std::string> notes;  // extra lines for the table's header (links, capacities)
  std::vector<BaselineResult> baselines;
};

// Fills the report's workload fields (name, description, sizes, parts) from the workload run.
void describe_workload(RunReport& report, const Workload& workload);

void print_table(std::ostream& os, const RunReport& report);
void print_json(std::ostream& os, const RunReport& report);
void print_csv(std::ostream& os, const RunReport& report);
// Checks, before a run, that write_plot can write `path`: a file name without control characters,
// not a directory, creatable or writable now (an existing file is left as it is, a created one
// removed again), and gnuplot installed. kInvalidArgument naming --plot and the path, or
// kUnavailable when gnuplot is missing.
Status check_plot_path(const std::string& path);
// Writes a PNG to `path` with gnuplot: hit rate per tier (stacked) and TTFT p50/p90/p99 per
// baseline. The path and titles are quoted for gnuplot (never for a shell: gnuplot runs without
// one, bench/run/subprocess.hpp), gnuplot's stdout is discarded and its stderr is quoted in the
// error. kUnavailable when gnuplot cannot be run, kInternal when it fails.
Status write_plot(const std::string& path, const RunReport& report);

// "12.3 GB", "512 MB": decimal units, as link and capacity figures are quoted.
std::string human_bytes(double bytes);

}  // namespace kvtier::bench::run
