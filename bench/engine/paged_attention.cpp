#include "bench/engine/paged_attention.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/cpu/isa.hpp"

namespace kvtier::engine {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

PagedAttention::PagedAttention(const ModelShape& shape, const Geometry& geometry,
                               const HbmView& hbm, kernels::cpu::Isa isa)
    : shape_(shape), geometry_(geometry), hbm_(hbm) {
  options_.isa = isa;
  // Split-K off: see the header. One item per query block of at most 256 rows.
  options_.min_split_tokens = std::numeric_limits<uint32_t>::max();
}

Result<PagedAttention> PagedAttention::create(const ModelShape& shape, const Geometry& geometry,
                                              const HbmView& hbm, kernels::cpu::Isa isa) {
  KVTIER_RETURN_IF_ERROR(shape.validate());
  if (hbm.on_device) {
    return unavailable(
        "reference engine: the HBM arena is CUDA device memory and this engine's attention runs "
        "on the CPU (open the runtime with tiers.hbm.backend = emulated)");
  }
  if (geometry.layers != shape.layers || geometry.kv_heads != shape.kv_heads ||
      geometry.head_dim != shape.head_dim) {
    return invalid_argument(
        "reference engine: the runtime's geometry (layers " + std::to_string(geometry.layers) +
        ", kv_heads " + std::to_string(geometry.kv_heads) + ", head_dim " +
        std::to_string(geometry.head_dim) + ") does not match the model (layers " +
        std::to_string(shape.layers) + ", kv_heads " + std::to_string(shape.kv_heads) +
        ", head_dim " + std::to_string(shape.head_dim) + ")");
  }
  if (geometry.dtype == Dtype::kFP8E4M3) {
    return invalid_argument(
        "reference engine: fp8_e4m3 KV needs per-frame scales, which the HBM view does not carry; "
        "use f32, f16 or bf16");
  }
  if (hbm.base == nullptr || hbm.frames == 0 || hbm.frame_stride < geometry.page_bytes()) {
    return invalid_argument("reference engine: the HBM view has no frames of " +
                            std::to_string(geometry.page_bytes()) + " bytes");
  }
  if (kernels::cpu::isa_kernels(isa) == nullptr) {
    return unavailable(std::string("reference engine: this CPU cannot run the ") +
                       kernels::cpu::isa_name(isa) + " kernels");
  }
  return PagedAttention(shape, geometry, hbm, isa);
}

uint64_t PagedAttention::rows(std::span<const StepSlice> slices) const {
  uint64_t n = 0;
  for (const StepSlice& s : slices) n += s.tokens;
  return n;
}

Status PagedAttention::check_table(const LayerTable& table,
                                   std::span<const StepSlice> slices) const {
  const uint32_t pt = geometry_.page_tokens;
  if (table.indptr.size() != slices.size() + 1 || table.last_page_len.size() != slices.size()) {
    return internal_error("reference engine: a layer table of " +
                          std::to_string(table.last_page_len.size()) + " items for a step of " +
                          std::to_string(slices.size()));
  }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const uint64_t len = slices[i].context + slices[i].tokens;
    const int64_t pages = int64_t{table.indptr[i + 1]} - table.indptr[i];
    if (table.indptr[i] < 0 || pages != static_cast<int64_t>(ceil_div(len, pt)) ||
        static_cast<std::size_t>(table.indptr[i + 1]) > table.indices.size()) {
      return internal_error("reference engine: item " + std::to_string(i) + " has " +
                            std::to_string(pages) + " pages in the layer table; " +
                            std::to_string(len) + " tokens need " +
                            std::to_string(ceil_div(len, pt)));
    }
    if (slices[i].decode && slices[i].tokens != 1) {
      return invalid_argument("reference engine: decode item " + std::to_string(i) + " has " +
                              std::to_string(slices[i].tokens) + " tokens (decode appends one)");
    }
    for (int32_t p = table.indptr[i]; p < table.indptr[i + 1]; ++p) {
      const int32_t f = table.indices[static_cast<std::size_t>(p)];
      if (f < 0 || static_cast<uint32_t>(f) >= hbm_.frames) {
        return internal_error("reference engine: item " + std::to_string(i) + " page " +
                              std::to_string(p - table.indptr[i]) + " is frame " +
                              std::to_string(f) + ", outside the HBM arena of " +
                              std::to_string(hbm_.frames) + " frames");
      }
    }
  }
  return ok_status();
}

Status PagedAttention::write_kv(const LayerTable& table, std::span<const StepSlice> slices,
                                const float* k, const float* v) const {
  KVTIER_RETURN_IF_ERROR(check_table(table, slices));
  const kernels::cpu::IsaKernels* isa = kernels::cpu::isa_kernels(options_.isa);
  const uint32_t pt = geometry_.page_tokens;
  const std::size_t token_bytes = geometry_.token_bytes();
  const uint32_t kv_dim = shape_.kv_dim();
  auto* base = static_cast<uint8_t*>(hbm_.base);
  uint64_t row = 0;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const int32_t* frames = table.indices.data() + table.indptr[i];
    for (uint32_t t = 0; t < slices[i].tokens; ++t, ++row) {
      const uint64_t pos = slices[i].context + t;
      uint8_t* page = base + static_cast<std::size_t>(frames[pos / pt]) * hbm_.frame_stride;
      uint8_t* k_dst = page + (pos % pt) * token_bytes;
      uint8_t* v_dst = k_dst + pt * token_bytes;  // V follows K: [K|V][page_tokens][heads][dim]
      isa->from_f32(k + row * kv_dim, 1.0f, geometry_.dtype, k_dst, kv_dim);
      isa->from_f32(v + row * kv_dim, 1.0f, geometry_.dtype, v_dst, kv_dim);
    }
  }
  return ok_status();
}

kernels::AttentionParams PagedAttention::params() {
  kernels::AttentionParams p;
  p.kv = kernels::paged_kv_for(geometry_);
  p.kv.arena = static_cast<const uint8_t*>(hbm_.base);
  p.kv.frame_stride = hbm_.frame_stride;
  p.kv.num_frames = hbm_.frames;
  p.kv.batch = static_cast<uint32_t>(last_page_len_.size());
  p.kv.indptr = indptr_.data();
  p.kv.indices = indices_.data();
  p.kv.last_page_len = last_page_len_.data();
  // The runtime pinned every listed frame for this step; it offers no residency callback.
  p.residency.check = nullptr;
  p.residency.enabled = false;
  p.num_qo_heads = shape_.qo_heads;
  p.q = q_rows_.data();
  p.out = out_rows_.data();
  return p;
}

Status PagedAttention::attend(const LayerTable& table, std::span<const StepSlice> slices,
                              const float* q, float* out) {
  KVTIER_RETURN_IF_ERROR(check_table(table, slices));
  const uint32_t pt = geometry_.page_tokens;
  const std::size_t qd = shape_.q_dim();
  struct Run {
    uint64_t row;  // first global row
    uint64_t count;
  };
  std::vector<Run> runs;
  for (const bool decode : {true, false}) {
    indptr_.assign(1, 0);
    indices_.clear();
    last_page_len_.clear();
    q_indptr_.assign(1, 0);
    runs.clear();
    // One kernel entry: the sequence's first ceil(len / pt) frames, its last page holding the rest.
    const auto add_entry = [&](const int32_t* frames, uint64_t len) {
      const uint64_t pages = ceil_div(len, pt);
      for (uint64_t p = 0; p < pages; ++p) indices_.push_back(static_cast<uint32_t>(frames[p]));
      indptr_.push_back(static_cast<uint32_t>(indices_.size()));
      last_page_len_.push_back(static_cast<uint32_t>(len - (pages - 1) * pt));
    };
    uint64_t row = 0;
    for (std::size_t i = 0; i < slices.size(); ++i) {
      const StepSlice& s = slices[i];
      const int32_t* frames = table.indices.data() + table.indptr[i];
      if (s.decode == decode && s.tokens > 0) {
        if (decode) {
          add_entry(frames, s.context + 1);
          runs.push_back({row, 1});
        } else {
          // Page-aligned entries: [start, next page boundary or the chunk's end).
          const uint64_t end = s.context + s.tokens;
          for (uint64_t start = s.context; start < end;) {
            const uint64_t stop = std::min<uint64_t>((start / pt + 1) * pt, end);
            add_entry(frames, stop);
            q_indptr_.push_back(q_indptr_.back() + static_cast<uint32_t>(stop - start));
            runs.push_back({row + (start - s.context), stop - start});
            start = stop;
          }
        }
      }
      row += s.tokens;
    }
    if (runs.empty()) continue;
    uint64_t total = 0;
    for (const Run& r : runs) total += r.count;
    q_rows_.resize(total * qd);
    out_rows_.resize(total * qd);
    uint64_t at = 0;
    for (const Run& r : runs) {
      std::copy(q + r.row * qd, q + (r.row + r.count) * qd, q_rows_.begin() + at * qd);
      at += r.count;
    }
    kernels::AttentionParams p = params();
    if (!decode) p.q_indptr = q_indptr_.data();
    Status s = decode ? kernels::cpu::decode_attention(p, options_)
                      : kernels::cpu::prefill_attention(p, options_);
    if (!s.ok()) {
      return s.with_context(decode ? "reference engine: decode attention"
                                   : "reference engine: prefill attention");
    }
    at = 0;
    for (const Run& r : runs) {
      std::copy(out_rows_.begin() + at * qd, out_rows_.begin() + (at + r.count) * qd,
                out + r.row * qd);
      at += r.count;
    }
  }
  return ok_status();
}

}  // namespace kvtier::engine
