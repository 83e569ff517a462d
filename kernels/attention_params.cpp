#include "kernels/attention_params.hpp"

#include <cmath>
#include <string>

namespace kvtier::kernels {

float AttentionParams::effective_sm_scale() const {
  return sm_scale != 0.0f ? sm_scale : 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
}

uint32_t query_rows(const AttentionParams& p) {
  if (p.q_indptr == nullptr) return p.kv.batch;
  return p.kv.batch == 0 ? 0 : p.q_indptr[p.kv.batch];
}

Status validate_attention(const AttentionParams& p) {
  KVTIER_RETURN_IF_ERROR(validate_paged_kv(p.kv));
  if (p.num_qo_heads == 0 || p.num_qo_heads % p.kv.kv_heads != 0) {
    return invalid_argument("attention: num_qo_heads " + std::to_string(p.num_qo_heads) +
                            " is not a positive multiple of kv_heads " +
                            std::to_string(p.kv.kv_heads));
  }
  if (!std::isfinite(p.sm_scale)) return invalid_argument("attention: sm_scale is not finite");
  if (p.kv.batch == 0) return ok_status();
  if (p.q == nullptr || p.out == nullptr) return invalid_argument("attention: q or out is null");
  if (p.q_indptr != nullptr) {
    if (p.q_indptr[0] != 0) return invalid_argument("prefill: q_indptr[0] is not 0");
    for (uint32_t b = 0; b < p.kv.batch; ++b) {
      if (p.q_indptr[b + 1] < p.q_indptr[b]) {
        return invalid_argument("prefill: q_indptr decreases at sequence " + std::to_string(b));
      }
      const uint32_t chunk = p.q_indptr[b + 1] - p.q_indptr[b];
      const uint32_t len = sequence_length(p.kv, b);
      if (chunk > len) {
        return invalid_argument("prefill: sequence " + std::to_string(b) + " has a chunk of " +
                                std::to_string(chunk) + " query tokens but only " +
                                std::to_string(len) +
                                " KV tokens; the chunk's K/V must be in its pages");
      }
    }
  }
  return ok_status();
}

}  // namespace kvtier::kernels
