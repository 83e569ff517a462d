// AVX512_BF16 lane operations: the AVX-512 lane type plus the bf16 dot-product helpers that
// isa_core.inl's bf16 attention path uses when kBf16Dot is set. Everything else (conversions,
// abs_max, the streaming baseline, every other dtype's attention) is VecAvx512's, unchanged.
// Included inside an anonymous namespace by isa_avx512bf16.cpp only, after vec_avx512.inl; see
// isa.hpp for why nothing here may have external linkage.
//
// fp8 KV takes the same path (kFp8Dot): every e4m3 value is exact in bf16 (3 significant bits,
// exponents 2^-9..2^8, all normal in bf16), so 32 fp8 bytes become 32 bf16 values, NaN codes NaN,
// through two 128-entry byte tables (vpermi2b, AVX512_VBMI): one for the high byte of each bf16
// (its sign ORed in from the fp8 byte), one for the low byte; a vpermb first spreads the 32 bytes
// so that one vpunpcklbw leaves the 32 values in natural order. Five instructions per 32 values,
// where the exact f32 path spends seven and then twice the multiply-adds.
//
// A "pairs" vector is 32 bf16 values, i.e. 16 32-bit lanes each holding two consecutive elements
// (the even one in the low half), which is both the memory layout of a bf16 row and the operand
// vdpbf16ps multiplies lane by lane: dot(acc, a, b)[i] = acc[i] + a[2i] b[2i] + a[2i+1] b[2i+1],
// products exact, the two additions rounded to fp32 (inputs and result with denormals flushed).

// The bf16 bits of the e4m3 code c (0..127, sign clear): 0x7F is NaN.
constexpr uint16_t bf16_of_e4m3(uint32_t c) {
  if (c == 0x7F) return 0x7FC0;
  const uint32_t e = c >> 3, m = c & 7u;
  // Subnormal (e = 0): m * 2^-9; normal: (1 + m/8) * 2^(e-7). Powers of two: exact.
  float v =
      e == 0 ? static_cast<float>(m) * 0x1p-9f : (1.0f + static_cast<float>(m) / 8.0f) * 0x1p-7f;
  for (uint32_t i = 0; i < e; ++i) v *= 2.0f;
  return static_cast<uint16_t>(__builtin_bit_cast(uint32_t, v) >> 16);
}

// One byte of each code's bf16 (high: shift 8; low: shift 0), as the vpermi2b table of 128 bytes.
struct Fp8Bf16Table {
  alignas(64) uint8_t bytes[128];
  explicit constexpr Fp8Bf16Table(uint32_t shift) : bytes{} {
    for (uint32_t c = 0; c < 128; ++c) bytes[c] = static_cast<uint8_t>(bf16_of_e4m3(c) >> shift);
  }
};
inline constexpr Fp8Bf16Table kFp8Bf16High{8};
inline constexpr Fp8Bf16Table kFp8Bf16Low{0};

struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kBf16Dot = true;
  static constexpr bool kFp8Dot = true;
  using Pairs = __m512i;

  static F dot(F acc, Pairs a, Pairs b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static Pairs load_pairs(const void* p) { return _mm512_loadu_si512(p); }
  // 16 bf16 (32 bytes) in the low half, zeros above: a head_dim that is an odd multiple of 16.
  static Pairs load_pairs_half(const void* p) {
    return _mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  // 32 fp8 e4m3 values at p as 32 bf16 in natural order (exact; NaN codes give NaN).
  static Pairs load_fp8_pairs(const void* p) {
    return fp8_to_bf16(_mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p))));
  }
  // 16 fp8 values (16 bytes) as 16 bf16 in the low half, zeros above.
  static Pairs load_fp8_pairs_half(const void* p) {
    // Bytes 16..31 are zero, code 0, which is bf16 0.
    return fp8_to_bf16(_mm512_zextsi128_si512(_mm_loadu_si128(static_cast<const __m128i*>(p))));
  }
  // Bytes 0..31 of x (fp8 codes) as 32 bf16: spread so that byte 8j + i (i < 8) sits at 16j + i,
  // both bytes of each bf16 looked up, interleaved back into 16-bit lanes.
  static __m512i fp8_to_bf16(__m512i x) {
    const __m512i spread =
        _mm512_set_epi8(31, 30, 29, 28, 27, 26, 25, 24, 31, 30, 29, 28, 27, 26, 25, 24,  //
                        23, 22, 21, 20, 19, 18, 17, 16, 23, 22, 21, 20, 19, 18, 17, 16,  //
                        15, 14, 13, 12, 11, 10, 9, 8, 15, 14, 13, 12, 11, 10, 9, 8,      //
                        7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i y = _mm512_permutexvar_epi8(spread, x);
    const __m512i hi_table0 = _mm512_load_si512(kFp8Bf16High.bytes);
    const __m512i hi_table1 = _mm512_load_si512(kFp8Bf16High.bytes + 64);
    const __m512i lo_table0 = _mm512_load_si512(kFp8Bf16Low.bytes);
    const __m512i lo_table1 = _mm512_load_si512(kFp8Bf16Low.bytes + 64);
    // hi | (y & 0x80): the sign bit of each code is the sign bit of its bf16.
    const __m512i hi =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi_table0, y, hi_table1), y,
                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
    const __m512i lo = _mm512_permutex2var_epi8(lo_table0, y, lo_table1);
    return _mm512_unpacklo_epi8(lo, hi);
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
  // The 16 bf16 in the low halves of rows a and b, interleaved in natural order: lane i holds
  // (a[i], b[i]).
  static Pairs interleave_low_halves(Pairs a, Pairs b) {
    const __m512i x = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(a));
    const __m512i y = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(b));
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
