#include "bench/engine/ops.hpp"

#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

namespace kvtier::engine {
namespace {

// A block of y: kRowBlock rows x kColBlock columns fits L1 while w streams past it once.
constexpr uint32_t kRowBlock = 16;
constexpr uint32_t kColBlock = 64;

void matmul_block(const float* x, uint32_t in, const float* w, uint32_t out, float* y, uint32_t r0,
                  uint32_t r1, uint32_t c0, uint32_t c1) {
  for (uint32_t r = r0; r < r1; ++r)
    std::fill(y + std::size_t{r} * out + c0, y + std::size_t{r} * out + c1, 0.0f);
  for (uint32_t k = 0; k < in; ++k) {
    const float* __restrict wk = w + std::size_t{k} * out;
    for (uint32_t r = r0; r < r1; ++r) {
      const float xk = x[std::size_t{r} * in + k];
      float* __restrict yr = y + std::size_t{r} * out;
      for (uint32_t c = c0; c < c1; ++c) yr[c] += xk * wk[c];
    }
  }
}

}  // namespace

void matmul(const float* x, uint32_t rows, uint32_t in, const float* w, uint32_t out, float* y) {
  if (rows == 0 || out == 0) return;
  // Small products run inline: a task costs more than the arithmetic.
  if (static_cast<uint64_t>(rows) * in * out < (1u << 16)) {
    matmul_block(x, in, w, out, y, 0, rows, 0, out);
    return;
  }
  tbb::parallel_for(tbb::blocked_range2d<uint32_t>(0, rows, kRowBlock, 0, out, kColBlock),
                    [&](const tbb::blocked_range2d<uint32_t>& b) {
                      matmul_block(x, in, w, out, y, b.rows().begin(), b.rows().end(),
                                   b.cols().begin(), b.cols().end());
                    });
}

void rms_norm(const float* x, uint32_t rows, uint32_t dim, const float* gain, float eps, float* y) {
  for (uint32_t r = 0; r < rows; ++r) {
    const float* xr = x + std::size_t{r} * dim;
    float* yr = y + std::size_t{r} * dim;
    float sum = 0.0f;
    for (uint32_t i = 0; i < dim; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    for (uint32_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * gain[i];
  }
}

void apply_rope(float* x, uint32_t rows, uint32_t heads, uint32_t head_dim,
                const uint64_t* positions, float theta) {
  const uint32_t half = head_dim / 2;
  for (uint32_t r = 0; r < rows; ++r) {
    const double pos = static_cast<double>(positions[r]);
    for (uint32_t i = 0; i < half; ++i) {
      // In double, then rounded once: the angle of a late position keeps its low bits.
      const double freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const float c = static_cast<float>(std::cos(pos * freq));
      const float s = static_cast<float>(std::sin(pos * freq));
      for (uint32_t h = 0; h < heads; ++h) {
        float* v = x + (std::size_t{r} * heads + h) * head_dim;
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
  }
}

void swiglu(const float* gate, const float* up, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_into(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

uint32_t argmax(const float* x, uint32_t n) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < n; ++i) {
    if (x[i] > x[best] || (std::isnan(x[best]) && !std::isnan(x[i]))) best = i;
  }
  return best;
}

}  // namespace kvtier::engine
