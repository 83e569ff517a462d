// The reference engine's model: a small decoder-only transformer shaped like Llama (RMSNorm,
// rotary position embeddings, grouped-query attention, a SwiGLU MLP), with weights drawn from a
// fixed seed. It exists to prove that kvtier fits an engine, not to say anything useful.
//
// Owns its weights: plain f32 arrays, immutable once generated, read by every thread without locks
// (engines share one model through shared_ptr<const Weights>). Matrices are stored input-major
// ([in][out]), so a row of activations times a matrix streams the matrix once per block of rows.
//
// The weights come from a counter-based generator (splitmix64 of the seed, a tensor number and the
// element index) rather than from <random> distributions, whose outputs differ between standard
// libraries: one seed gives one model, bit for bit, on every platform. Rejected: a real checkpoint
// (a large download, and nothing here depends on what the model says) and a trained toy model
// (training code that proves nothing about kvtier).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier::engine {

struct ModelShape {
  uint32_t layers = 4;
  uint32_t d_model = 256;
  uint32_t qo_heads = 8;
  uint32_t kv_heads = 2;  // grouped-query attention: qo_heads / kv_heads query heads per KV head
  uint32_t head_dim = 32;
  uint32_t ffn_dim = 512;  // SwiGLU hidden width
  uint32_t vocab = 512;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  uint64_t seed = 0x6b76746965720001ull;

  uint32_t q_dim() const { return qo_heads * head_dim; }
  uint32_t kv_dim() const { return kv_heads * head_dim; }

  // Every size positive, heads divisible, head_dim even (rotary pairs) and a multiple of 16 up to
  // 256 (what the paged-attention kernels take).
  Status validate() const;

  // The KV geometry kvtier must be opened with for this model.
  Geometry geometry(Dtype dtype, uint32_t page_tokens) const {
    return Geometry{layers, kv_heads, head_dim, dtype, page_tokens};
  }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [d_model]
  std::vector<float> wq;         // [d_model][q_dim]
  std::vector<float> wk;         // [d_model][kv_dim]
  std::vector<float> wv;         // [d_model][kv_dim]
  std::vector<float> wo;         // [q_dim][d_model]
  std::vector<float> mlp_norm;   // [d_model]
  std::vector<float> w_gate;     // [d_model][ffn_dim]
  std::vector<float> w_up;       // [d_model][ffn_dim]
  std::vector<float> w_down;     // [ffn_dim][d_model]
};

struct Weights {
  ModelShape shape;
  std::vector<float> embedding;  // [vocab][d_model]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [d_model]
  std::vector<float> lm_head;     // [d_model][vocab]

  // invalid_argument when the shape is not valid; resource_exhausted when memory runs out.
  static Result<std::shared_ptr<const Weights>> generate(const ModelShape& shape);
  uint64_t parameter_count() const;
};

}  // namespace kvtier::engine
