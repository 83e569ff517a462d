// Hardware and model presets of the long-context benchmark (`kvtier-bench run --clock virtual`):
// a GPU with its share of a server (HBM, PCIe, host memory, NVMe, achieved efficiencies, how the
// engine batches) and a model (parameters and KV shape). YAML files in configs/bench/, compiled
// into the program so a named preset ("h200", "llama-3.1-8b") needs no file at run time; a path
// loads any other file of the same shape.
//
// Every key is required in a file: a preset is a statement about hardware, and a silently
// defaulted figure would be a wrong statement. Unknown keys are errors (with a "did you mean"),
// so a typo never falls back to nothing. Errors name the source, line:column (1-based) and the
// key path. Sizes take the units of configs/default.yaml (parse_size); bandwidths and FLOP/s are
// plain numbers (bytes or FLOP per second, 1e9 notation allowed). Plain values, no threads.
//
// Rejected: reading these through the runtime's Config loader (they are not runtime settings and
// must not appear in `kvtier-bench check`), and one combined file per (GPU, model) pair (four
// files would become N x M).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::bench::run {

enum class ComputeFormat : uint8_t { kBf16 = 0, kFp8 = 1 };

struct GpuPreset {
  std::string name;
  std::string source;  // where it was read from, for the report
  // gpu
  uint64_t hbm_bytes = 0;
  double hbm_bandwidth = 0;  // bytes/s
  double bf16_flops = 0;     // dense, FLOP/s
  double fp8_flops = 0;
  uint64_t reserved_bytes = 0;  // HBM the engine keeps besides weights
  double pcie_bandwidth = 0;    // bytes/s per direction
  double pcie_latency_us = 0;
  // host
  uint64_t host_kv_bytes = 0;
  // nvme
  uint64_t nvme_bytes = 0;
  double nvme_read_bandwidth = 0;
  double nvme_write_bandwidth = 0;
  double nvme_latency_us = 0;
  // efficiency
  double flops_efficiency = 0;
  double hbm_efficiency = 0;
  double pcie_efficiency = 0;
  double nvme_efficiency = 0;
  double iteration_overhead_us = 0;
  // engine
  uint32_t max_batched_tokens = 0;
  uint32_t max_sequences = 0;
  uint32_t page_tokens = 0;
  uint32_t layer_group = 0;
  uint32_t max_step_iterations = 0;
  double kv_admit_fraction = 0;
};

struct ModelPreset {
  std::string name;
  std::string source;
  double parameters = 0;
  uint32_t layers = 0;
  uint32_t qo_heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  Dtype kv_dtype = Dtype::kBF16;
  double weight_bytes = 0;  // per parameter
  ComputeFormat compute = ComputeFormat::kBf16;

  // K and V of one token over all layers.
  uint64_t kv_bytes_per_token() const {
    return 2ull * layers * kv_heads * head_dim * dtype_size(kv_dtype);
  }
};

// Names of the compiled-in presets ("h100", "h200"; "llama-3.1-8b", "llama-3.1-70b").
std::vector<std::string> gpu_preset_names();
std::vector<std::string> model_preset_names();

// A compiled-in preset by name, or a YAML file by path (anything containing '/' or ending in
// ".yaml"). kNotFound for an unknown name (listing the known ones).
Result<GpuPreset> load_gpu_preset(std::string_view name_or_path);
Result<ModelPreset> load_model_preset(std::string_view name_or_path);

// From YAML text; `source` names it in messages.
Result<GpuPreset> parse_gpu_preset(std::string_view yaml, std::string_view source);
Result<ModelPreset> parse_model_preset(std::string_view yaml, std::string_view source);

// The compiled-in text of configs/bench/<name>.yaml; empty when there is none
// (presets_text.cpp, generated at build time).
std::string_view embedded_preset(std::string_view name);
std::vector<std::string> embedded_preset_names();

}  // namespace kvtier::bench::run
