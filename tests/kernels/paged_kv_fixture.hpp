// Test fixture: a random paged KV arena with a CSR block table, and the naive fp64 attention that
// every kernel is checked against.
//
// Pages of the batch's sequences are scattered over a larger arena in random order (with unused
// frames between them), frames may be padded beyond the page size, and the last page of each
// sequence is partial when its length says so. Values are drawn in f32 and stored in the arena's
// dtype; fp8 pages get a random per-page scale per half. The reference reads back exactly the
// stored values, so its only difference from a kernel is the kernel's f32 arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_params.hpp"
#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels::testing {

struct KvShape {
  uint32_t kv_heads = 2;
  uint32_t head_dim = 64;
  uint32_t page_tokens = 16;
  Dtype dtype = Dtype::kF32;
  uint32_t group = 1;          // query heads per KV head
  uint64_t frame_padding = 0;  // bytes of padding after each page
  uint32_t spare_frames = 5;   // unused frames mixed into the arena
  float value_scale = 1.0f;    // K/V magnitude
  float query_scale = 1.0f;    // q magnitude
};

class PagedKvFixture {
 public:
  // `lengths[b]` tokens per sequence (>= 1); `chunks` empty = decode, else query tokens per
  // sequence for prefill.
  PagedKvFixture(const KvShape& shape, std::vector<uint32_t> lengths, std::vector<uint32_t> chunks,
                 uint32_t seed)
      : shape_(shape), lengths_(std::move(lengths)), chunks_(std::move(chunks)), rng_(seed) {
    kv_ = paged_kv_for(Geometry{1, shape.kv_heads, shape.head_dim, shape.dtype, shape.page_tokens});
    kv_.frame_stride = kv_.page_bytes() + shape.frame_padding;
    kv_.batch = static_cast<uint32_t>(lengths_.size());
    indptr_.push_back(0);
    for (uint32_t b = 0; b < kv_.batch; ++b) {
      const uint32_t pages = (lengths_[b] + shape.page_tokens - 1) / shape.page_tokens;
      indptr_.push_back(indptr_.back() + pages);
      last_page_len_.push_back(lengths_[b] - (pages - 1) * shape.page_tokens);
    }
    const uint32_t nnz = indptr_.back();
    kv_.num_frames = nnz + shape.spare_frames;
    std::vector<uint32_t> perm(kv_.num_frames);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng_);
    indices_.assign(perm.begin(), perm.begin() + nnz);
    arena_.assign(kv_.num_frames * kv_.frame_stride, 0xA5);  // garbage in unused bytes
    scales_.assign(2 * kv_.num_frames, 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> scale_dist(0.01f, 0.05f);
    std::mt19937 scale_rng(seed ^ 0x5CA1Eu);  // its own stream: values match other dtypes' draws
    const std::size_t half =
        static_cast<std::size_t>(shape.page_tokens) * shape.kv_heads * shape.head_dim;
    for (uint32_t f = 0; f < kv_.num_frames; ++f) {
      uint8_t* page = arena_.data() + f * kv_.frame_stride;
      for (int part = 0; part < 2; ++part) {
        float scale = 1.0f;
        if (shape.dtype == Dtype::kFP8E4M3) {
          scale = scale_dist(scale_rng) * shape.value_scale;
          scales_[2 * f + part] = scale;
        }
        for (std::size_t i = 0; i < half; ++i) {
          const float x = normal(rng_) * shape.value_scale;
          store_from_float(page, shape.dtype, part * half + i,
                           shape.dtype == Dtype::kFP8E4M3 ? x / scale : x);
        }
      }
    }
    kv_.arena = arena_.data();
    kv_.indptr = indptr_.data();
    kv_.indices = indices_.data();
    kv_.last_page_len = last_page_len_.data();
    kv_.scales = shape.dtype == Dtype::kFP8E4M3 ? scales_.data() : nullptr;

    if (!chunks_.empty()) {
      q_indptr_.push_back(0);
      for (uint32_t c : chunks_) q_indptr_.push_back(q_indptr_.back() + c);
    }
    const uint32_t rows = chunks_.empty() ? kv_.batch : q_indptr_.back();
    q_.resize(static_cast<std::size_t>(rows) * num_qo_heads() * shape.head_dim);
    for (float& x : q_) x = normal(rng_) * shape.query_scale;
    out_.assign(q_.size(), std::nanf(""));
    lse_.assign(static_cast<std::size_t>(rows) * num_qo_heads(), std::nanf(""));
  }

  uint32_t num_qo_heads() const { return shape_.kv_heads * shape_.group; }
  uint32_t rows() const { return chunks_.empty() ? kv_.batch : q_indptr_.back(); }

  AttentionParams params() {
    AttentionParams p;
    p.kv = kv_;
    p.num_qo_heads = num_qo_heads();
    p.q_indptr = chunks_.empty() ? nullptr : q_indptr_.data();
    p.q = q_.data();
    p.out = out_.data();
    p.lse = lse_.data();
    return p;
  }

  // The frame and the element index within it of K (part 0) or V (part 1) of token `pos` of
  // sequence b, head h, dim d.
  uint32_t frame_of(uint32_t b, uint32_t pos) const {
    return indices_[indptr_[b] + pos / shape_.page_tokens];
  }
  std::size_t element_in_frame(int part, uint32_t pos, uint32_t h, uint32_t d) const {
    const std::size_t half =
        static_cast<std::size_t>(shape_.page_tokens) * shape_.kv_heads * shape_.head_dim;
    return part * half +
           (static_cast<std::size_t>(pos % shape_.page_tokens) * shape_.kv_heads + h) *
               shape_.head_dim +
           d;
  }

  // The stored value of that element.
  double kv_value(int part, uint32_t b, uint32_t pos, uint32_t h, uint32_t d) const {
    const uint32_t frame = frame_of(b, pos);
    const double v = load_as_float(arena_.data() + frame * kv_.frame_stride, shape_.dtype,
                                   element_in_frame(part, pos, h, d));
    return shape_.dtype == Dtype::kFP8E4M3 ? v * scales_[2 * frame + part] : v;
  }

  // Overwrites that element with the raw byte `code` (fp8 pages only).
  void set_fp8_code(int part, uint32_t b, uint32_t pos, uint32_t h, uint32_t d, uint8_t code) {
    arena_[frame_of(b, pos) * kv_.frame_stride + element_in_frame(part, pos, h, d)] = code;
  }

  // Overwrites that element with `value` stored in the arena's dtype (fp8: value / the page's
  // scale, so a NaN stays a NaN code).
  void set_value(int part, uint32_t b, uint32_t pos, uint32_t h, uint32_t d, float value) {
    const uint32_t frame = frame_of(b, pos);
    const float stored =
        shape_.dtype == Dtype::kFP8E4M3 ? value / scales_[2 * frame + part] : value;
    store_from_float(arena_.data() + frame * kv_.frame_stride, shape_.dtype,
                     element_in_frame(part, pos, h, d), stored);
  }

  // Naive fp64 attention: out [rows][heads][dim] and lse [rows][heads]. K/V of one sequence and KV
  // head are widened to double once and shared by the query heads of its group.
  void reference(std::vector<double>& out, std::vector<double>& lse, float sm_scale = 0.0f) const {
    const uint32_t heads = num_qo_heads();
    const uint32_t dim = shape_.head_dim;
    const double scale = sm_scale != 0.0f ? sm_scale : 1.0 / std::sqrt(static_cast<double>(dim));
    out.assign(static_cast<std::size_t>(rows()) * heads * dim, 0.0);
    lse.assign(static_cast<std::size_t>(rows()) * heads, 0.0);
    std::vector<double> s, k, v;
    for (uint32_t b = 0; b < kv_.batch; ++b) {
      const uint32_t chunk = chunks_.empty() ? 1 : chunks_[b];
      const uint32_t row0 = chunks_.empty() ? b : q_indptr_[b];
      const uint32_t len = lengths_[b];
      for (uint32_t kvh = 0; kvh < shape_.kv_heads; ++kvh) {
        k.resize(static_cast<std::size_t>(len) * dim);
        v.resize(k.size());
        for (uint32_t j = 0; j < len; ++j) {
          for (uint32_t d = 0; d < dim; ++d) {
            k[static_cast<std::size_t>(j) * dim + d] = kv_value(0, b, j, kvh, d);
            v[static_cast<std::size_t>(j) * dim + d] = kv_value(1, b, j, kvh, d);
          }
        }
        for (uint32_t i = 0; i < chunk; ++i) {
          const uint32_t visible = len - chunk + i + 1;
          for (uint32_t g = 0; g < shape_.group; ++g) {
            const uint32_t h = kvh * shape_.group + g;
            const std::size_t row = static_cast<std::size_t>(row0 + i) * heads + h;
            const float* q = q_.data() + row * dim;
            s.assign(visible, 0.0);
            double mx = -INFINITY;
            for (uint32_t j = 0; j < visible; ++j) {
              double acc = 0.0;
              const double* kj = k.data() + static_cast<std::size_t>(j) * dim;
              for (uint32_t d = 0; d < dim; ++d) acc += static_cast<double>(q[d]) * kj[d];
              s[j] = acc * scale;
              mx = std::max(mx, s[j]);
            }
            double sum = 0.0;
            for (double& x : s) {
              x = std::exp(x - mx);
              sum += x;
            }
            double* o = out.data() + row * dim;
            for (uint32_t j = 0; j < visible; ++j) {
              const double* vj = v.data() + static_cast<std::size_t>(j) * dim;
              for (uint32_t d = 0; d < dim; ++d) o[d] += s[j] * vj[d];
            }
            for (uint32_t d = 0; d < dim; ++d) o[d] /= sum;
            lse[row] = mx + std::log(sum);
          }
        }
      }
    }
  }

  const std::vector<float>& out() const { return out_; }
  const std::vector<float>& lse() const { return lse_; }
  std::vector<float>& mutable_out() { return out_; }
  std::vector<uint8_t>& arena() { return arena_; }
  std::vector<float>& scales() { return scales_; }
  const std::vector<uint32_t>& indices() const { return indices_; }
  const std::vector<uint32_t>& indptr() const { return indptr_; }
  const std::vector<uint32_t>& last_page_len() const { return last_page_len_; }
  const std::vector<uint32_t>& q_indptr() const { return q_indptr_; }
  const std::vector<float>& q() const { return q_; }
  std::vector<float>& mutable_q() { return q_; }
  const PagedKv& kv() const { return kv_; }

  // Copies the pages (and fp8 scales) of sequence `src` of `other` into the frames of sequence
  // `dst` here; both must have the same length and shape.
  void copy_sequence_from(const PagedKvFixture& other, uint32_t src, uint32_t dst) {
    const uint32_t pages = indptr_[dst + 1] - indptr_[dst];
    for (uint32_t j = 0; j < pages; ++j) {
      const uint32_t from = other.indices_[other.indptr_[src] + j];
      const uint32_t to = indices_[indptr_[dst] + j];
      std::memcpy(arena_.data() + to * kv_.frame_stride,
                  other.arena_.data() + from * other.kv_.frame_stride, kv_.page_bytes());
      scales_[2 * to] = other.scales_[2 * from];
      scales_[2 * to + 1] = other.scales_[2 * from + 1];
    }
  }

 private:
  KvShape shape_;
  std::vector<uint32_t> lengths_;
  std::vector<uint32_t> chunks_;
  std::mt19937 rng_;
  PagedKv kv_;
  std::vector<uint8_t> arena_;
  std::vector<float> scales_;
  std::vector<uint32_t> indptr_, indices_, last_page_len_, q_indptr_;
  std::vector<float> q_, out_, lse_;
};

}  // namespace kvtier::kernels::testing
