// The CPU kernels, written once over a lane type V (vec_scalar.inl, vec_avx2.inl, vec_avx512.inl)
// and compiled once per instruction set. Included inside an anonymous namespace in namespace
// kvtier::kernels::cpu, after V's definition; see isa.hpp for the linkage rules this obeys.
//
// Attention of a work item walks its KV range in tiles of kTileTokens tokens. For each tile and KV
// head it widens the tile's K and V rows to f32 once (fp8 scales folded in), then updates every
// query row of that head: scores in register blocks of 4 rows x 4 tokens, one online-softmax
// rescale per row per tile (not per token), and the weighted V sum in blocks of 4 rows. Widening
// first keeps one compute path for all dtypes; the tile (2 x 16 x head_dim floats) stays in L1.

template <Dtype D>
constexpr std::size_t elem_bytes() {
  if constexpr (D == Dtype::kF32) return 4;
  if constexpr (D == Dtype::kF16 || D == Dtype::kBF16) return 2;
  return 1;
}

template <class V, Dtype D>
inline typename V::F load_elems(const uint8_t* p) {
  if constexpr (D == Dtype::kF32) {
    return V::load_f32(p);
  } else if constexpr (D == Dtype::kF16) {
    return V::load_f16(p);
  } else if constexpr (D == Dtype::kBF16) {
    return V::load_bf16(p);
  } else {
    return V::load_fp8(p);
  }
}

template <class V, Dtype D>
inline void store_elems(uint8_t* p, typename V::F v) {
  if constexpr (D == Dtype::kF32) {
    V::store_f32(p, v);
  } else if constexpr (D == Dtype::kF16) {
    V::store_f16(p, v);
  } else if constexpr (D == Dtype::kBF16) {
    V::store_bf16(p, v);
  } else {
    V::store_fp8(p, v);
  }
}

// ---------------------------------------------------------------------------------------------
// Element-wise conversions. A tail shorter than one vector goes through a zero-padded local copy,
// so the scalar conversions never need to be compiled with these flags.
// ---------------------------------------------------------------------------------------------

template <class V, Dtype D>
void to_f32_t(const uint8_t* src, float scale, float* dst, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  constexpr std::size_t kEs = elem_bytes<D>();
  const auto s = V::set1(scale);
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) V::store(dst + i, V::mul(load_elems<V, D>(src + i * kEs), s));
  if (i < n) {
    alignas(64) uint8_t in[kW * 4] = {};
    alignas(64) float out[kW];
    __builtin_memcpy(in, src + i * kEs, (n - i) * kEs);
    V::store(out, V::mul(load_elems<V, D>(in), s));
    __builtin_memcpy(dst + i, out, (n - i) * sizeof(float));
  }
}

template <class V>
void to_f32(const void* src, Dtype dtype, float scale, float* dst, std::size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case Dtype::kF32:
      return to_f32_t<V, Dtype::kF32>(p, scale, dst, n);
    case Dtype::kF16:
      return to_f32_t<V, Dtype::kF16>(p, scale, dst, n);
    case Dtype::kBF16:
      return to_f32_t<V, Dtype::kBF16>(p, scale, dst, n);
    case Dtype::kFP8E4M3:
      return to_f32_t<V, Dtype::kFP8E4M3>(p, scale, dst, n);
  }
}

template <class V, Dtype D>
void from_f32_t(const float* src, float scale, uint8_t* dst, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  constexpr std::size_t kEs = elem_bytes<D>();
  const auto s = V::set1(scale);
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) store_elems<V, D>(dst + i * kEs, V::mul(V::load(src + i), s));
  if (i < n) {
    alignas(64) float in[kW] = {};
    alignas(64) uint8_t out[kW * 4];
    __builtin_memcpy(in, src + i, (n - i) * sizeof(float));
    store_elems<V, D>(out, V::mul(V::load(in), s));
    __builtin_memcpy(dst + i * kEs, out, (n - i) * kEs);
  }
}

template <class V>
void from_f32(const float* src, float scale, Dtype dtype, void* dst, std::size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  switch (dtype) {
    case Dtype::kF32:
      return from_f32_t<V, Dtype::kF32>(src, scale, p, n);
    case Dtype::kF16:
      return from_f32_t<V, Dtype::kF16>(src, scale, p, n);
    case Dtype::kBF16:
      return from_f32_t<V, Dtype::kBF16>(src, scale, p, n);
    case Dtype::kFP8E4M3:
      return from_f32_t<V, Dtype::kFP8E4M3>(src, scale, p, n);
  }
}

template <class V, Dtype D>
float abs_max_t(const uint8_t* src, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  constexpr std::size_t kEs = elem_bytes<D>();
  auto acc = V::zero();
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) acc = V::max_keep_nan(acc, V::abs(load_elems<V, D>(src + i * kEs)));
  if (i < n) {
    alignas(64) uint8_t in[kW * 4] = {};
    __builtin_memcpy(in, src + i * kEs, (n - i) * kEs);
    acc = V::max_keep_nan(acc, V::abs(load_elems<V, D>(in)));
  }
  return V::reduce_max_keep_nan(acc);
}

template <class V>
float abs_max(const void* src, Dtype dtype, std::size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case Dtype::kF32:
      return abs_max_t<V, Dtype::kF32>(p, n);
    case Dtype::kF16:
      return abs_max_t<V, Dtype::kF16>(p, n);
    case Dtype::kBF16:
      return abs_max_t<V, Dtype::kBF16>(p, n);
    case Dtype::kFP8E4M3:
      return abs_max_t<V, Dtype::kFP8E4M3>(p, n);
  }
  return 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

// scores[r][t] = q_r . k_t for an RB x TB block; q rows and k rows are `dim` floats apart.
template <class V, int RB, int TB>
inline void score_block(const float* q, const float* k, uint32_t dim, float* scores) {
  typename V::F acc[RB][TB];
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) acc[r][t] = V::zero();
  }
  for (uint32_t d = 0; d < dim; d += V::kWidth) {
    typename V::F kv[TB];
    for (int t = 0; t < TB; ++t) kv[t] = V::load(k + t * dim + d);
    for (int r = 0; r < RB; ++r) {
      const auto qv = V::load(q + r * dim + d);
      for (int t = 0; t < TB; ++t) acc[r][t] = V::fmadd(qv, kv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    if constexpr (TB == 4) {
      V::reduce_add4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], scores + r * kTileTokens);
    } else {
      for (int t = 0; t < TB; ++t) scores[r * kTileTokens + t] = V::reduce_add(acc[r][t]);
    }
  }
}

template <class V, int RB>
inline void score_rows(const float* q, const float* k, uint32_t tokens, uint32_t dim,
                       float* scores) {
  uint32_t t = 0;
  for (; t + 4 <= tokens; t += 4) score_block<V, RB, 4>(q, k + t * dim, dim, scores + t);
  for (; t < tokens; ++t) score_block<V, RB, 1>(q, k + t * dim, dim, scores + t);
}

// o_r = o_r * alpha_r + sum_t p[r][t] * v_t for RB rows.
template <class V, int RB>
inline void accumulate_rows(const float* p, const float* alpha, const float* v, uint32_t tokens,
                            uint32_t dim, float* o) {
  for (uint32_t d = 0; d < dim; d += V::kWidth) {
    typename V::F acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = V::mul(V::load(o + r * dim + d), V::set1(alpha[r]));
    for (uint32_t t = 0; t < tokens; ++t) {
      const auto vv = V::load(v + t * dim + d);
      for (int r = 0; r < RB; ++r) acc[r] = V::fmadd(V::set1(p[r * kTileTokens + t]), vv, acc[r]);
    }
    for (int r = 0; r < RB; ++r) V::store(o + r * dim + d, acc[r]);
  }
}

struct TileRows {
  const float* q;  // [rows][dim]
  uint32_t rows;
  uint32_t group;               // row r belongs to query token r / group
  const uint32_t* visible_end;  // per query token
  uint32_t tile_begin;          // KV position of the tile's first token
  float* m;
  float* l;
  float* o;       // [rows][dim]
  float* scores;  // [rows][kTileTokens]
  float* alpha;   // [rows]
};

template <class V>
void attend_tile(const TileRows& a, const float* k, const float* v, uint32_t tokens, uint32_t dim) {
  constexpr float kNegInf = -__builtin_inff();
  uint32_t r = 0;
  for (; r + 4 <= a.rows; r += 4) {
    score_rows<V, 4>(a.q + r * dim, k, tokens, dim, a.scores + r * kTileTokens);
  }
  for (; r < a.rows; ++r)
    score_rows<V, 1>(a.q + r * dim, k, tokens, dim, a.scores + r * kTileTokens);

  for (r = 0; r < a.rows; ++r) {
    float* s = a.scores + r * kTileTokens;
    const uint32_t end = a.visible_end[r / a.group];
    const uint32_t visible =
        end <= a.tile_begin ? 0 : (end - a.tile_begin < tokens ? end - a.tile_begin : tokens);
    if (visible == 0) {
      for (uint32_t t = 0; t < kTileTokens; ++t) s[t] = 0.0f;
      a.alpha[r] = 1.0f;
      continue;
    }
    for (uint32_t t = visible; t < kTileTokens; ++t) s[t] = kNegInf;
    auto mx = V::load(s);
    for (uint32_t t = V::kWidth; t < kTileTokens; t += V::kWidth) mx = V::max(mx, V::load(s + t));
    const float tile_max = V::reduce_max(mx);
    const float m_new = a.m[r] > tile_max ? a.m[r] : tile_max;
    const float alpha = V::first(V::exp2(V::set1(a.m[r] - m_new)));
    auto sum = V::zero();
    const auto shift = V::set1(m_new);
    for (uint32_t t = 0; t < kTileTokens; t += V::kWidth) {
      const auto p = V::exp2(V::sub(V::load(s + t), shift));
      V::store(s + t, p);
      sum = V::add(sum, p);
    }
    a.l[r] = a.l[r] * alpha + V::reduce_add(sum);
    a.m[r] = m_new;
    a.alpha[r] = alpha;
  }

  for (r = 0; r + 4 <= a.rows; r += 4) {
    accumulate_rows<V, 4>(a.scores + r * kTileTokens, a.alpha + r, v, tokens, dim, a.o + r * dim);
  }
  for (; r < a.rows; ++r) {
    accumulate_rows<V, 1>(a.scores + r * kTileTokens, a.alpha + r, v, tokens, dim, a.o + r * dim);
  }
}

template <class V, Dtype D>
void attend_item_t(const ItemArgs& a) {
  constexpr std::size_t kEs = elem_bytes<D>();
  const uint32_t dim = a.head_dim;
  const uint32_t rows = a.q_tokens * a.group;
  const std::size_t head_bytes = static_cast<std::size_t>(dim) * kEs;
  const std::size_t token_bytes = head_bytes * a.kv_heads;
  const std::size_t v_offset = token_bytes * a.page_tokens;
  float* k_tile = a.work;
  float* v_tile = k_tile + kTileTokens * dim;
  float* scores = v_tile + kTileTokens * dim;
  float* alpha = scores + static_cast<std::size_t>(rows) * kTileTokens;

  const uint8_t* k_row[kTileTokens];
  float k_scale[kTileTokens];
  float v_scale[kTileTokens];
  for (uint32_t begin = a.kv_begin; begin < a.kv_end; begin += kTileTokens) {
    const uint32_t tokens = a.kv_end - begin < kTileTokens ? a.kv_end - begin : kTileTokens;
    for (uint32_t j = 0; j < tokens; ++j) {
      const uint32_t pos = begin + j;
      const uint32_t page = pos / a.page_tokens;
      const uint32_t frame = a.pages[page];
      k_row[j] = a.arena + frame * a.frame_stride + (pos - page * a.page_tokens) * token_bytes;
      k_scale[j] = a.scales != nullptr ? a.scales[2 * static_cast<std::size_t>(frame)] : 1.0f;
      v_scale[j] = a.scales != nullptr ? a.scales[2 * static_cast<std::size_t>(frame) + 1] : 1.0f;
    }
    for (uint32_t h = 0; h < a.kv_heads; ++h) {
      for (uint32_t j = 0; j < tokens; ++j) {
        const uint8_t* k_src = k_row[j] + h * head_bytes;
        to_f32_t<V, D>(k_src, k_scale[j], k_tile + j * dim, dim);
        to_f32_t<V, D>(k_src + v_offset, v_scale[j], v_tile + j * dim, dim);
      }
      const std::size_t row0 = static_cast<std::size_t>(h) * rows;
      TileRows tile{a.q + row0 * dim, rows,       a.group,          a.visible_end, begin,
                    a.m + row0,       a.l + row0, a.o + row0 * dim, scores,        alpha};
      attend_tile<V>(tile, k_tile, v_tile, tokens, dim);
    }
  }
}

template <class V>
void attend_item(const ItemArgs& a) {
  switch (a.dtype) {
    case Dtype::kF32:
      return attend_item_t<V, Dtype::kF32>(a);
    case Dtype::kF16:
      return attend_item_t<V, Dtype::kF16>(a);
    case Dtype::kBF16:
      return attend_item_t<V, Dtype::kBF16>(a);
    case Dtype::kFP8E4M3:
      return attend_item_t<V, Dtype::kFP8E4M3>(a);
  }
}

template <class V>
constexpr IsaKernels make_kernels(Isa isa, const char* name) {
  return IsaKernels{
      isa, name, &to_f32<V>, &from_f32<V>, &abs_max<V>, &attend_item<V>, &V::stream_read};
}
