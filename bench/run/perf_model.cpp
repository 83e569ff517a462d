// PerfModel: the roofline of one engine iteration. See perf_model.hpp.
#include "bench/run/perf_model.hpp"

#include <algorithm>
#include <string>

#include "runtime/config_size.hpp"

namespace kvtier::bench::run {

Result<PerfModel> PerfModel::create(const GpuPreset& gpu, const ModelPreset& model) {
  PerfModel m;
  m.gpu_ = gpu;
  m.model_ = model;
  m.weight_bytes_ = static_cast<uint64_t>(model.parameters * model.weight_bytes);
  const uint64_t taken = m.weight_bytes_ + gpu.reserved_bytes;
  if (taken >= gpu.hbm_bytes) {
    return invalid_argument("model " + model.name + " does not fit on " + gpu.name + ": weights " +
                            format_size_approx(m.weight_bytes_) + " + reserved " +
                            format_size_approx(gpu.reserved_bytes) + " >= HBM " +
                            format_size_approx(gpu.hbm_bytes));
  }
  m.hbm_kv_bytes_ = gpu.hbm_bytes - taken;
  if (gpu.layer_group == 0 || model.layers % gpu.layer_group != 0) {
    return invalid_argument("engine.layer_group (" + std::to_string(gpu.layer_group) + ") of " +
                            gpu.source + " must divide the " + std::to_string(model.layers) +
                            " layers of " + model.name);
  }
  m.sim_geometry_.layers = model.layers / gpu.layer_group;
  m.sim_geometry_.kv_heads = model.kv_heads * gpu.layer_group;
  m.sim_geometry_.head_dim = model.head_dim;
  m.sim_geometry_.dtype = model.kv_dtype;
  m.sim_geometry_.page_tokens = gpu.page_tokens;
  const double peak = model.compute == ComputeFormat::kFp8 ? gpu.fp8_flops : gpu.bf16_flops;
  m.achieved_flops_ = peak * gpu.flops_efficiency;
  m.achieved_hbm_bw_ = gpu.hbm_bandwidth * gpu.hbm_efficiency;
  m.linear_flops_per_token_ = 2.0 * model.parameters;
  m.attention_flops_per_pair_ = 4.0 * model.layers * model.qo_heads * model.head_dim;
  return m;
}

Nanos PerfModel::iteration_time(const IterationWork& w) const {
  const double flops =
      linear_flops_per_token_ * static_cast<double>(w.tokens()) +
      attention_flops_per_pair_ *
          (w.prefill_pairs + static_cast<double>(w.decode_context + w.decode_tokens));
  const double bytes = static_cast<double>(weight_bytes_) +
                       static_cast<double>(kv_bytes_per_token()) *
                           static_cast<double>(w.prefill_context + w.decode_context + w.tokens());
  const double seconds = std::max(flops / achieved_flops_, bytes / achieved_hbm_bw_);
  return static_cast<Nanos>(seconds * 1e9 + gpu_.iteration_overhead_us * 1e3);
}

Nanos PerfModel::prefill_time(const IterationWork& w) const {
  const double flops = linear_flops_per_token_ * static_cast<double>(w.prefill_tokens) +
                       attention_flops_per_pair_ * w.prefill_pairs;
  return static_cast<Nanos>(flops / achieved_flops_ * 1e9);
}

double PerfModel::prefill_tokens_per_s() const {
  // A chunk of max_batched_tokens at no context: the fastest prefill runs, so a load is planned
  // only when it beats the best case of recomputing.
  const double n = std::max<double>(1.0, gpu_.max_batched_tokens);
  const double flops_per_token =
      linear_flops_per_token_ +
      attention_flops_per_pair_ * chunk_pairs(0, static_cast<uint64_t>(n)) / n;
  return achieved_flops_ / flops_per_token;
}

}  // namespace kvtier::bench::run
