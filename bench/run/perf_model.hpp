// PerfModel: how long one engine iteration takes on the modeled GPU — a roofline over the named
// model's FLOPs and bytes — and the geometry the simulation runs at.
//
// Per iteration (one forward pass over a batch of prefill chunks and decode tokens):
//   flops  = 2 * P * T                           (GEMMs: P parameters, T query tokens in the batch)
//          + 4 * L * Hq * d * A                  (attention: QK^T and PV over A (query, key) pairs)
//   bytes  = W                                   (weights, read once per iteration)
//          + kv * (C + T)                        (KV read: C context tokens; KV written: T tokens)
//   time   = overhead + max(flops / (peak * eff_flops), bytes / (hbm_bw * eff_hbm))
// where L layers, Hq query heads, d head_dim, kv = KV bytes per token (all layers), peak the dense
// Tensor Core FLOP/s of the model's compute format. A prefill chunk of n tokens after c cached
// ones has A = n*c + n(n+1)/2 pairs and reads C = c tokens of KV once (flash attention keeps the
// chunk's queries on chip); a decode token at context c has A = c + 1 and reads C = c. Prefill is
// compute bound and decode memory bound, so the max() picks the right roof for a mixed batch.
// Prefill GPU time (a reported metric) is the prefill part of the FLOPs at the achieved rate.
//
// Simulation geometry: pages of `page_tokens` tokens (the preset's coarse page) and
// `layer_group` model layers per simulated layer (kv_heads scaled by the group so page bytes are
// the group's bytes): the scheduler pipelines L / layer_group stages per step. Bytes and times are
// those of the full model either way. Immutable; any thread.
#pragma once

#include <cstdint>

#include "bench/run/presets.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"
#include "scheduler/clock.hpp"

namespace kvtier::bench::run {

// The work of one engine iteration.
struct IterationWork {
  uint64_t prefill_tokens = 0;
  double prefill_pairs = 0;      // attention (query, key) pairs of the prefill chunks
  uint64_t prefill_context = 0;  // cached tokens the chunks attend to (KV read once per chunk)
  uint64_t decode_tokens = 0;
  uint64_t decode_context = 0;    // sum over decode sequences of their context
  uint64_t recompute_tokens = 0;  // prompt tokens recomputed instead of loaded (in prefill_*)

  uint64_t tokens() const { return prefill_tokens + decode_tokens; }
};

// Attention pairs of a chunk of `n` tokens after `context` cached tokens.
inline double chunk_pairs(uint64_t context, uint64_t n) {
  return static_cast<double>(n) * static_cast<double>(context) +
         static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
}

class PerfModel {
 public:
  static Result<PerfModel> create(const GpuPreset& gpu, const ModelPreset& model);

  Nanos iteration_time(const IterationWork& work) const;
  // GPU time of the prefill part of `work` (its FLOPs at the achieved rate).
  Nanos prefill_time(const IterationWork& work) const;
  // Prompt tokens per second of prefill at a short context: what compute-or-load weighs a load
  // against (policies.prefill_tokens_per_s).
  double prefill_tokens_per_s() const;

  const GpuPreset& gpu() const { return gpu_; }
  const ModelPreset& model() const { return model_; }
  // HBM left for KV: capacity - weights - reserved.
  uint64_t hbm_kv_bytes() const { return hbm_kv_bytes_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  uint64_t kv_bytes_per_token() const { return model_.kv_bytes_per_token(); }
  // The simulation's geometry (see the header comment).
  const Geometry& sim_geometry() const { return sim_geometry_; }
  double achieved_flops() const { return achieved_flops_; }
  double achieved_hbm_bandwidth() const { return achieved_hbm_bw_; }

 private:
  GpuPreset gpu_;
  ModelPreset model_;
  Geometry sim_geometry_;
  uint64_t hbm_kv_bytes_ = 0;
  uint64_t weight_bytes_ = 0;
  double achieved_flops_ = 0;
  double achieved_hbm_bw_ = 0;
  double linear_flops_per_token_ = 0;
  double attention_flops_per_pair_ = 0;
};

}  // namespace kvtier::bench::run
