// The reference engine's attention over kvtier's HBM frames: it writes a step's new K/V into the
// frames a layer table lists and runs the project's CPU paged-attention kernels over that table —
// decode attention for generating sequences, chunked-prefill attention for prompt chunks. The
// engine's K/V lives nowhere else: what the attention reads is exactly what kvtier kept, moved and
// brought back.
//
// Owns scratch buffers only; the frames belong to the runtime (hbm_view) and the table to the step.
// One PagedAttention per engine thread (the scratch is not shared); kernel calls use the caller's
// oneTBB task arena.
//
// Determinism. A query row's result must not depend on the rest of the step, so that a prompt
// computed in other batches, other chunk sizes or on another thread count — or not computed at all
// but loaded — gives the same bits:
//  - the kernels run with split-K off (one work item per query block): their default split size
//    grows with the batch's total tokens and shrinks with the thread count, and a row split in two
//    is merged in a different rounding order than a row read in one pass;
//  - prefill rows are cut at page boundaries into separate kernel entries (CSR items sharing the
//    sequence's frames, each ending where its chunk ends), so block j of a prompt is always
//    computed as the same entry [j * page_tokens, (j + 1) * page_tokens) with the same visible
//    context, however the engine chunked the prompt. (Within one entry, which kernel register path
//    scores a token depends on where the entry ends.)
// Rejected: decode attention for every prompt row (also invariant, but it reads the context once
// per row instead of once per page of rows).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bench/engine/model.hpp"
#include "kernels/cpu/attention.hpp"
#include "kvtier/kvtier.hpp"

namespace kvtier::engine {

// One batch item of a step as the attention sees it. Its rows are consecutive in q, k, v and out,
// items in batch order.
struct StepSlice {
  uint64_t context = 0;  // tokens with K/V before the step: the first row is at this position
  uint32_t tokens = 0;   // rows this step (K/V written, queries attended)
  bool decode = false;   // a generating sequence's one token (decode kernel); else a prompt chunk
};

class PagedAttention {
 public:
  // unavailable when the HBM arena is device memory (these are CPU kernels); invalid_argument
  // when the geometry does not match the model or the dtype is fp8 (the HBM view has no scales).
  static Result<PagedAttention> create(const ModelShape& shape, const Geometry& geometry,
                                       const HbmView& hbm,
                                       kernels::cpu::Isa isa = kernels::cpu::Isa::kAuto);

  // Stores rows of k and v ([rows][kv_dim] f32) as the slices' new tokens in the table's frames.
  // internal when the table does not list the pages the slices need (a runtime or engine bug).
  Status write_kv(const LayerTable& table, std::span<const StepSlice> slices, const float* k,
                  const float* v) const;

  // out[rows][q_dim] = causal attention of q ([rows][q_dim] f32) over each row's sequence up to and
  // including its own position.
  Status attend(const LayerTable& table, std::span<const StepSlice> slices, const float* q,
                float* out);

  uint64_t rows(std::span<const StepSlice> slices) const;

 private:
  PagedAttention(const ModelShape& shape, const Geometry& geometry, const HbmView& hbm,
                 kernels::cpu::Isa isa);
  Status check_table(const LayerTable& table, std::span<const StepSlice> slices) const;
  kernels::AttentionParams params();

  ModelShape shape_;
  Geometry geometry_;
  HbmView hbm_;
  kernels::cpu::CpuOptions options_;
  // Scratch, reused across calls: CSR arrays and gathered q/out rows of each kernel call.
  std::vector<uint32_t> indptr_, indices_, last_page_len_, q_indptr_;
  std::vector<float> q_rows_, out_rows_;
};

}  // namespace kvtier::engine
