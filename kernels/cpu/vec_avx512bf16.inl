// AVX512_BF16 lane operations: the AVX-512 lane type plus the bf16 dot-product helpers that
// isa_core.inl's bf16 attention path uses when kBf16Dot is set. Everything else (conversions,
// abs_max, the streaming baseline, every other dtype's attention) is VecAvx512's, unchanged.
// Included inside an anonymous namespace by isa_avx512bf16.cpp only, after vec_avx512.inl; see
// isa.hpp for why nothing here may have external linkage.
//
// A "pairs" vector is 32 bf16 values, i.e. 16 32-bit lanes each holding two consecutive elements
// (the even one in the low half), which is both the memory layout of a bf16 row and the operand
// vdpbf16ps multiplies lane by lane: dot(acc, a, b)[i] = acc[i] + a[2i] b[2i] + a[2i+1] b[2i+1],
// products exact, the two additions rounded to fp32 (inputs and result with denormals flushed).

struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kBf16Dot = true;
  using Pairs = __m512i;

  static F dot(F acc, Pairs a, Pairs b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static Pairs load_pairs(const void* p) { return _mm512_loadu_si512(p); }
  // 16 bf16 (32 bytes) in the low half, zeros above: a head_dim that is an odd multiple of 16.
  static Pairs load_pairs_half(const void* p) {
    return _mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  // Both elements of every lane from one 32-bit word (a pair of softmax weights).
  static Pairs broadcast_pair(const void* p) {
    uint32_t w;
    __builtin_memcpy(&w, p, sizeof(w));
    return _mm512_set1_epi32(static_cast<int>(w));
  }

  // 16 floats rounded to bf16 (nearest even) and stored as 32 bytes at `dst`.
  static void store_bf16_rne(void* dst, F v) {
    _mm256_storeu_si256(static_cast<__m256i*>(dst),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
  // As store_bf16_rne, and returns the rounded values widened back to f32 (exactly).
  static F store_bf16_rne_widen(void* dst, F v) {
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    _mm256_storeu_si256(static_cast<__m256i*>(dst), h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }

  // Rows a and b (32 bf16 each) interleaved per 128-bit lane: lo holds (a[d], b[d]) for d in
  // {0-3, 8-11, 16-19, 24-27}, hi for {4-7, 12-15, 20-23, 28-31} (vpunpcklwd / vpunpckhwd).
  static void interleave(Pairs a, Pairs b, Pairs& lo, Pairs& hi) {
    lo = _mm512_unpacklo_epi16(a, b);
    hi = _mm512_unpackhi_epi16(a, b);
  }
  // Rows a and b, 16 bf16 each, interleaved in natural order: lane i holds (a[i], b[i]).
  static Pairs interleave_half(const void* a, const void* b) {
    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(a)));
    const __m512i y = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(b)));
    return _mm512_or_si512(x, _mm512_slli_epi32(y, 16));
  }

  // 32 floats of o between natural order and the (lo, hi) order interleave() accumulates in.
  static void to_pair_order(float* o) {
    const F a = _mm512_loadu_ps(o);
    const F b = _mm512_loadu_ps(o + 16);
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
    _mm512_storeu_ps(o, _mm512_permutex2var_ps(a, lo, b));
    _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(a, hi, b));
  }
  static void from_pair_order(float* o) {
    const F lo = _mm512_loadu_ps(o);
    const F hi = _mm512_loadu_ps(o + 16);
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
};
