// The dense operations of the reference engine's transformer, on f32 rows of activations.
//
// Every result element is computed by one fixed sequence of roundings that depends only on its
// own inputs: a matmul output sums its products in input order k = 0, 1, ... whatever the number
// of rows, the blocking or the thread that computes it; a norm sums its squares in element order.
// So a token's activations do not depend on which other tokens share its step, how a prompt was
// chunked, or how many threads ran — the property that lets a run with a tiny HBM tier (different
// batches, loads instead of recomputation) be compared bit for bit with one that never offloads.
// The library is compiled with -ffp-contract=off so that the compiler cannot fuse a multiply and
// an add in one loop version and not in another (a vectorised body against its scalar tail).
// Rejected: a BLAS (fast, but free to reorder sums by shape and thread count).
//
// Functions are thread-safe; matmul spreads column blocks over oneTBB workers of the caller's
// task arena.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier::engine {

// y[rows][out] = x[rows][in] * w[in][out]. y must not alias x or w.
void matmul(const float* x, uint32_t rows, uint32_t in, const float* w, uint32_t out, float* y);

// y[r] = x[r] * gain / sqrt(mean(x[r]^2) + eps), per row of `dim`. y may alias x.
void rms_norm(const float* x, uint32_t rows, uint32_t dim, const float* gain, float eps, float* y);

// Rotary embedding in place over `heads` heads of `head_dim` per row, rotating the pairs
// (i, i + head_dim / 2) by positions[r] * theta^(-2i / head_dim) (the Llama/GPT-NeoX layout).
void apply_rope(float* x, uint32_t rows, uint32_t heads, uint32_t head_dim,
                const uint64_t* positions, float theta);

// out[i] = silu(gate[i]) * up[i]. out may alias gate.
void swiglu(const float* gate, const float* up, std::size_t n, float* out);

// y[i] += x[i].
void add_into(float* y, const float* x, std::size_t n);

// The index of the largest element; the first one on ties. NaN never wins.
uint32_t argmax(const float* x, uint32_t n);

}  // namespace kvtier::engine
