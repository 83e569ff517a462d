#include "kernels/cpu/attention.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/scratch.hpp"

namespace kvtier::kernels::cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr uint32_t kDefaultMinSplitTokens = 1024;
// Query rows (tokens x heads) an item keeps state for: bounds the per-thread state to
// 256 x (head_dim + 2) floats, at most 258 KiB, which an L2 holds.
constexpr uint32_t kMaxItemRows = 256;

// A block of query tokens of one sequence, split along the KV axis into `splits` items.
struct QueryBlock {
  uint32_t seq;
  uint32_t row_begin;    // global query row of the block's first token
  uint32_t chunk_begin;  // index of that token within its sequence's chunk
  uint32_t tokens;
  uint32_t kv_len;
  uint32_t chunk_len;
  uint32_t visible_hi;  // KV tokens the block's last query token sees
  uint32_t splits;
  std::size_t first_item;
};

struct Item {
  uint32_t block;
  uint32_t kv_begin;
  uint32_t kv_end;
  std::size_t partial;  // offset into the partial-state buffer (split blocks only)
};

struct Plan {
  std::vector<QueryBlock> blocks;
  std::vector<Item> items;
  std::size_t partial_floats = 0;
};

Plan make_plan(const AttentionParams& p, const CpuOptions& options) {
  Plan plan;
  const uint32_t tokens_per_block = std::max(1u, kMaxItemRows / p.num_qo_heads);
  const std::size_t state_floats =
      static_cast<std::size_t>(tokens_per_block) * p.num_qo_heads * (p.kv.head_dim + 2);
  for (uint32_t b = 0; b < p.kv.batch; ++b) {
    const uint32_t len = sequence_length(p.kv, b);
    const uint32_t chunk = p.q_indptr != nullptr ? p.q_indptr[b + 1] - p.q_indptr[b] : 1;
    const uint32_t row0 = p.q_indptr != nullptr ? p.q_indptr[b] : b;
    for (uint32_t i = 0; i < chunk; i += tokens_per_block) {
      QueryBlock qb{};
      qb.seq = b;
      qb.row_begin = row0 + i;
      qb.chunk_begin = i;
      qb.tokens = std::min(tokens_per_block, chunk - i);
      qb.kv_len = len;
      qb.chunk_len = chunk;
      qb.visible_hi = len - chunk + i + qb.tokens;
      plan.blocks.push_back(qb);
    }
  }
  // The split length depends on the options only — never on the thread count or on the rest of
  // the batch — so a sequence's result is the same bit for bit however it is batched and on
  // however many cores it runs (the merge of its splits runs in split order).
  const uint64_t min_split =
      options.min_split_tokens != 0 ? options.min_split_tokens : kDefaultMinSplitTokens;
  uint64_t split = std::min<uint64_t>(min_split, uint64_t{1} << 31);
  split = (split + kTileTokens - 1) / kTileTokens * kTileTokens;
  for (uint32_t qi = 0; qi < plan.blocks.size(); ++qi) {
    QueryBlock& qb = plan.blocks[qi];
    qb.splits = static_cast<uint32_t>((qb.visible_hi + split - 1) / split);
    qb.first_item = plan.items.size();
    for (uint32_t s = 0; s < qb.splits; ++s) {
      Item item{};
      item.block = qi;
      item.kv_begin = static_cast<uint32_t>(s * split);
      item.kv_end = static_cast<uint32_t>(std::min<uint64_t>((s + 1) * split, qb.visible_hi));
      if (qb.splits > 1) {
        item.partial = plan.partial_floats;
        plan.partial_floats += state_floats;
      }
      plan.items.push_back(item);
    }
  }
  return plan;
}

void run_item(const AttentionParams& p, const IsaKernels& isa, const Plan& plan, const Item& item,
              float* partials) {
  const QueryBlock& qb = plan.blocks[item.block];
  const uint32_t dim = p.kv.head_dim;
  const uint32_t heads = p.num_qo_heads;
  const uint32_t group = heads / p.kv.kv_heads;
  const uint32_t rows_per_head = qb.tokens * group;
  const std::size_t rows = static_cast<std::size_t>(qb.tokens) * heads;

  ThreadScratch& scratch = thread_scratch();
  float* q = scratch.floats(0, rows * dim);
  float* m = scratch.floats(1, rows);
  float* l = scratch.floats(2, rows);
  float* o = scratch.floats(3, rows * dim);
  // Scores and weights of every KV head of a tile (isa_core.inl scores a tile's K in address
  // order, all heads at once): [kv_heads][rows_per_head][kTileTokens], then
  // [kv_heads][rows_per_head].
  float* work = scratch.floats(4, rows * (kTileTokens + 1));
  uint16_t* q_bf16 = scratch.halves(5, rows * dim);  // touched only by ISAs that take q in bf16
  uint32_t* visible_end = scratch.words(qb.tokens);

  // Re-lay q as [kv_head][token][group member][dim], pre-scaled into log2 units.
  const float q_scale = p.effective_sm_scale() * kLog2e;
  for (uint32_t t = 0; t < qb.tokens; ++t) {
    const float* src = p.q + (static_cast<std::size_t>(qb.row_begin) + t) * heads * dim;
    for (uint32_t h = 0; h < heads; ++h) {
      const uint32_t kvh = h / group;
      const std::size_t row = static_cast<std::size_t>(kvh) * rows_per_head + t * group + h % group;
      for (uint32_t d = 0; d < dim; ++d) q[row * dim + d] = src[h * dim + d] * q_scale;
    }
    visible_end[t] = qb.kv_len - qb.chunk_len + qb.chunk_begin + t + 1;
  }
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dim, 0.0f);

  ItemArgs args{};
  args.arena = p.kv.arena;
  args.frame_stride = p.kv.frame_stride;
  args.dtype = p.kv.dtype;
  args.kv_heads = p.kv.kv_heads;
  args.head_dim = dim;
  args.page_tokens = p.kv.page_tokens;
  args.scales = p.kv.dtype == Dtype::kFP8E4M3 ? p.kv.scales : nullptr;
  args.pages = p.kv.indices + p.kv.indptr[qb.seq];
  args.kv_begin = item.kv_begin;
  args.kv_end = item.kv_end;
  args.group = group;
  args.q_tokens = qb.tokens;
  args.visible_end = visible_end;
  args.q = q;
  args.m = m;
  args.l = l;
  args.o = o;
  args.q_bf16 = q_bf16;
  args.work = work;
  isa.attend_item(args);

  if (qb.splits > 1) {
    // Partial state, in the same row order as q: m, l, then o.
    float* dst = partials + item.partial;
    std::copy(m, m + rows, dst);
    std::copy(l, l + rows, dst + rows);
    std::copy(o, o + rows * dim, dst + 2 * rows);
    return;
  }
  for (uint32_t t = 0; t < qb.tokens; ++t) {
    const std::size_t out_row = static_cast<std::size_t>(qb.row_begin) + t;
    for (uint32_t h = 0; h < heads; ++h) {
      const std::size_t row =
          static_cast<std::size_t>(h / group) * rows_per_head + t * group + h % group;
      const float inv = 1.0f / l[row];
      float* dst = p.out + (out_row * heads + h) * dim;
      for (uint32_t d = 0; d < dim; ++d) dst[d] = o[row * dim + d] * inv;
      if (p.lse != nullptr) p.lse[out_row * heads + h] = (m[row] + std::log2(l[row])) * kLn2;
    }
  }
}

// Exact merge of the splits of one query block: rescale each split to the common maximum.
void merge_block(const AttentionParams& p, const Plan& plan, const QueryBlock& qb,
                 const float* partials) {
  const uint32_t dim = p.kv.head_dim;
  const uint32_t heads = p.num_qo_heads;
  const uint32_t group = heads / p.kv.kv_heads;
  const uint32_t rows_per_head = qb.tokens * group;
  const std::size_t rows = static_cast<std::size_t>(qb.tokens) * heads;
  std::vector<float> acc(dim);
  for (uint32_t t = 0; t < qb.tokens; ++t) {
    const std::size_t out_row = static_cast<std::size_t>(qb.row_begin) + t;
    for (uint32_t h = 0; h < heads; ++h) {
      const std::size_t row =
          static_cast<std::size_t>(h / group) * rows_per_head + t * group + h % group;
      float m_max = -std::numeric_limits<float>::infinity();
      for (uint32_t s = 0; s < qb.splits; ++s) {
        const float* part = partials + plan.items[qb.first_item + s].partial;
        m_max = std::max(m_max, part[row]);
      }
      float l_sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (uint32_t s = 0; s < qb.splits; ++s) {
        const float* part = partials + plan.items[qb.first_item + s].partial;
        if (part[rows + row] == 0.0f) continue;  // this split saw nothing of this row
        const float w = std::exp2(part[row] - m_max);
        l_sum += part[rows + row] * w;
        const float* o = part + 2 * rows + row * dim;
        for (uint32_t d = 0; d < dim; ++d) acc[d] += o[d] * w;
      }
      const float inv = 1.0f / l_sum;
      float* dst = p.out + (out_row * heads + h) * dim;
      for (uint32_t d = 0; d < dim; ++d) dst[d] = acc[d] * inv;
      if (p.lse != nullptr) p.lse[out_row * heads + h] = (m_max + std::log2(l_sum)) * kLn2;
    }
  }
}

Status run_attention(const AttentionParams& p, const CpuOptions& options) {
  const IsaKernels* isa = isa_kernels(options.isa);
  if (isa == nullptr) {
    return unavailable(std::string("attention: this CPU cannot run the ") + isa_name(options.isa) +
                       " kernels");
  }
  KVTIER_RETURN_IF_ERROR(validate_attention(p));
  if (p.kv.batch == 0) return ok_status();
  KVTIER_RETURN_IF_ERROR(check_residency(p.residency, p.kv.indices, p.kv.indptr[p.kv.batch]));
  try {
    const Plan plan = make_plan(p, options);
    std::vector<float> partials(plan.partial_floats);
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, plan.items.size(), 1),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        for (std::size_t i = range.begin(); i != range.end(); ++i) {
                          run_item(p, *isa, plan, plan.items[i], partials.data());
                        }
                      });
    if (plan.partial_floats != 0) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, plan.blocks.size(), 1),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          for (std::size_t i = range.begin(); i != range.end(); ++i) {
                            if (plan.blocks[i].splits > 1) {
                              merge_block(p, plan, plan.blocks[i], partials.data());
                            }
                          }
                        });
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("attention: out of memory for the work plan or scratch of " +
                              std::to_string(p.kv.batch) + " sequences");
  }
  return ok_status();
}

}  // namespace

Status decode_attention(const AttentionParams& p, const CpuOptions& options) {
  if (p.q_indptr != nullptr) {
    return invalid_argument("decode attention: q_indptr must be null (one query per sequence)");
  }
  return run_attention(p, options);
}

Status prefill_attention(const AttentionParams& p, const CpuOptions& options) {
  if (p.q_indptr == nullptr) {
    return invalid_argument("prefill attention: q_indptr is required");
  }
  return run_attention(p, options);
}

}  // namespace kvtier::kernels::cpu
