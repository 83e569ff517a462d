#include "bench/engine/model.hpp"

#include <cmath>
#include <new>
#include <string>

namespace kvtier::engine {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of tensor `tensor`: uniform in [-bound, bound), a pure function of (seed, tensor, i).
// 24 random bits make a float in [0, 1) exactly, so no rounding depends on the platform.
class TensorFiller {
 public:
  explicit TensorFiller(uint64_t seed) : seed_(seed) {}

  std::vector<float> uniform(std::size_t n, float bound) {
    const uint64_t base = splitmix64(seed_ ^ splitmix64(++tensor_));
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float u = static_cast<float>(splitmix64(base + i) >> 40) * 0x1.0p-24f;
      out[i] = (2.0f * u - 1.0f) * bound;
    }
    return out;
  }

  // Fan-in scaling: variance 1 / fan_in, so activations keep their size through a matrix.
  std::vector<float> matrix(uint32_t in, uint32_t out) {
    return uniform(static_cast<std::size_t>(in) * out, std::sqrt(3.0f / static_cast<float>(in)));
  }

  // Norm gains near 1, not exactly 1, so a wrong gain cannot go unnoticed.
  std::vector<float> gain(uint32_t n) {
    std::vector<float> g = uniform(n, 0.1f);
    for (float& x : g) x += 1.0f;
    return g;
  }

 private:
  uint64_t seed_;
  uint64_t tensor_ = 0;
};

}  // namespace

Status ModelShape::validate() const {
  const auto positive = [](uint32_t v, const char* name) -> Status {
    if (v == 0) return invalid_argument(std::string("model shape: ") + name + " must be > 0");
    return ok_status();
  };
  KVTIER_RETURN_IF_ERROR(positive(layers, "layers"));
  KVTIER_RETURN_IF_ERROR(positive(d_model, "d_model"));
  KVTIER_RETURN_IF_ERROR(positive(qo_heads, "qo_heads"));
  KVTIER_RETURN_IF_ERROR(positive(kv_heads, "kv_heads"));
  KVTIER_RETURN_IF_ERROR(positive(ffn_dim, "ffn_dim"));
  KVTIER_RETURN_IF_ERROR(positive(vocab, "vocab"));
  if (qo_heads % kv_heads != 0) {
    return invalid_argument("model shape: qo_heads " + std::to_string(qo_heads) +
                            " is not a multiple of kv_heads " + std::to_string(kv_heads));
  }
  if (head_dim == 0 || head_dim % 16 != 0 || head_dim > 256) {
    return invalid_argument("model shape: head_dim " + std::to_string(head_dim) +
                            " must be a multiple of 16 up to 256 (the attention kernels' rule)");
  }
  if (!(rope_theta > 1.0f) || !(rms_eps > 0.0f)) {
    return invalid_argument("model shape: rope_theta must be > 1 and rms_eps > 0");
  }
  return ok_status();
}

Result<std::shared_ptr<const Weights>> Weights::generate(const ModelShape& shape) {
  KVTIER_RETURN_IF_ERROR(shape.validate());
  try {
    auto w = std::make_shared<Weights>();
    w->shape = shape;
    TensorFiller fill(shape.seed);
    w->embedding = fill.uniform(static_cast<std::size_t>(shape.vocab) * shape.d_model, 1.0f);
    w->layers.resize(shape.layers);
    for (LayerWeights& l : w->layers) {
      l.attn_norm = fill.gain(shape.d_model);
      l.wq = fill.matrix(shape.d_model, shape.q_dim());
      l.wk = fill.matrix(shape.d_model, shape.kv_dim());
      l.wv = fill.matrix(shape.d_model, shape.kv_dim());
      l.wo = fill.matrix(shape.q_dim(), shape.d_model);
      l.mlp_norm = fill.gain(shape.d_model);
      l.w_gate = fill.matrix(shape.d_model, shape.ffn_dim);
      l.w_up = fill.matrix(shape.d_model, shape.ffn_dim);
      l.w_down = fill.matrix(shape.ffn_dim, shape.d_model);
    }
    w->final_norm = fill.gain(shape.d_model);
    w->lm_head = fill.matrix(shape.d_model, shape.vocab);
    return std::shared_ptr<const Weights>(std::move(w));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("model weights: out of memory for " + std::to_string(shape.layers) +
                              " layers of d_model " + std::to_string(shape.d_model));
  }
}

uint64_t Weights::parameter_count() const {
  uint64_t n = embedding.size() + final_norm.size() + lm_head.size();
  for (const LayerWeights& l : layers) {
    n += l.attn_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.wo.size() +
         l.mlp_norm.size() + l.w_gate.size() + l.w_up.size() + l.w_down.size();
  }
  return n;
}

}  // namespace kvtier::engine
