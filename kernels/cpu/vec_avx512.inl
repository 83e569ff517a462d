// AVX-512 (F/BW/VL/DQ) lane operations for isa_core.inl. Included inside an anonymous namespace by
// isa_avx512.cpp only; see isa.hpp for why nothing here may have external linkage.

struct VecAvx512 {
  using F = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kRegisters = 32;  // vector registers the register blocks may fill

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F load_f32(const void* p) { return _mm512_loadu_ps(p); }
  static void store_f32(void* p, F v) { _mm512_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F abs(F a) { return _mm512_abs_ps(a); }
  // Lanes where `a` is NaN become NaN in the result: max() alone would drop them.
  static F max_keep_nan(F acc, F a) {
    const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(_mm512_max_ps(a, acc), nan, a);  // NaN in acc stays (2nd operand)
  }
  static float first(F a) { return _mm512_cvtss_f32(a); }
  static float reduce_add(F a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(F a) { return _mm512_reduce_max_ps(a); }
  static float reduce_max_keep_nan(F a) {
    if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0) return __builtin_nanf("");
    return _mm512_reduce_max_ps(a);
  }

  // out[0..3] = horizontal sums of a, b, c, d.
  static void reduce_add4(F a, F b, F c, F d, float* out) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }

  // Lane L of the result = the horizontal op (add or max) of x[L], for 16 vectors at once, as a
  // transposing tree: each step folds two vectors' halves (blocks of 8, 4, 2, then 1 lanes) into
  // one vector, a's in the even blocks and b's in the odd ones, with one shuffle, one blend and one
  // op: 15 steps, 45 instructions (15 shuffles), where 16 separate horizontal sums take about 76
  // (44 shuffles; reduce_add4 four times). A step only ever combines two lanes of one input, so
  // NaN or inf in one x[L] reaches lane L alone. After the four levels lane L holds what was fed
  // in at position rev(L) (4-bit reversal), so x[L] goes in there. For the score blocks alone:
  // 14.5 -> 14.7 GiB/s (isa_core.inl bf16_split's measurement); softmax_rows_wide uses it too.
  template <class Op>
  static F transpose_reduce16(const F (&x)[16], Op op) {
    const auto step8 = [&](F a, F b) {
      return op(_mm512_mask_blend_ps(0xFF00, a, b), _mm512_shuffle_f32x4(a, b, 0x4E));
    };
    const auto step4 = [&](F a, F b) {
      const __m512i idx =
          _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
      return op(_mm512_mask_blend_ps(0xF0F0, a, b), _mm512_permutex2var_ps(a, idx, b));
    };
    const auto step2 = [&](F a, F b) {
      return op(_mm512_mask_blend_ps(0xCCCC, a, b), _mm512_shuffle_ps(a, b, 0x4E));
    };
    const auto step1 = [&](F a, F b) {
      const __m512i idx =
          _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
      return op(_mm512_mask_blend_ps(0xAAAA, a, b), _mm512_permutex2var_ps(a, idx, b));
    };
    // Position n takes x[rev(n)]: 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15.
    const F y0 = step8(x[0], x[8]), y1 = step8(x[4], x[12]);
    const F y2 = step8(x[2], x[10]), y3 = step8(x[6], x[14]);
    const F y4 = step8(x[1], x[9]), y5 = step8(x[5], x[13]);
    const F y6 = step8(x[3], x[11]), y7 = step8(x[7], x[15]);
    const F z0 = step4(y0, y1), z1 = step4(y2, y3), z2 = step4(y4, y5), z3 = step4(y6, y7);
    return step1(step2(z0, z1), step2(z2, z3));
  }
  static F reduce_add16(const F (&x)[16]) {
    return transpose_reduce16(x, [](F a, F b) { return _mm512_add_ps(a, b); });
  }
  static F reduce_max16(const F (&x)[16]) {
    return transpose_reduce16(x, [](F a, F b) { return _mm512_max_ps(a, b); });
  }

  // out[r * stride + t] = the horizontal sum of acc[r][t], a 4 x 4 block of score sums.
  static void reduce_add4x4(const F (&acc)[4][4], float* out, std::size_t stride) {
    const F x[16] = {acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1],
                     acc[1][2], acc[1][3], acc[2][0], acc[2][1], acc[2][2], acc[2][3],
                     acc[3][0], acc[3][1], acc[3][2], acc[3][3]};
    const F w = reduce_add16(x);
    _mm_storeu_ps(out, _mm512_castps512_ps128(w));
    _mm_storeu_ps(out + stride, _mm512_extractf32x4_ps(w, 1));
    _mm_storeu_ps(out + 2 * stride, _mm512_extractf32x4_ps(w, 2));
    _mm_storeu_ps(out + 3 * stride, _mm512_extractf32x4_ps(w, 3));
  }

  // 2^x; 0 below -126 (so exp2(-inf) == 0), degree-7 Taylor on [-0.5, 0.5] (rel. error < 1e-8).
  static F exp2(F x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
    // Clamped with x as the second operand, which min/max return when it is NaN: NaN stays NaN.
    x = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-126.0f), x));
    const F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm512_sub_ps(x, n);
    F p = _mm512_set1_ps(1.5252733804059841e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381610e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(e));
  }

  static F load_bf16(const void* p) {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 32 bf16 in one load, split without a shuffle: `even` gets elements 0, 2, .., 30 (shifted up
  // into the high half of each 32-bit lane), `odd` elements 1, 3, .., 31 (already in the high
  // half; the low one masked off). Two one-uop ALU ops per 32 values where load_bf16 takes a
  // shuffle and a shift per 16 (see bf16_split in isa_core.inl).
  static void load_bf16_split(const void* p, F& even, F& odd) {
    const __m512i w = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    odd = _mm512_castsi512_ps(_mm512_and_si512(w, high));
  }
  // The 32 floats at p from natural into load_bf16_split's order (0, 2, .., 30, 1, 3, .., 31)
  // and back: q and o once per item.
  static void to_split_order(float* p) {
    const F a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    _mm512_storeu_ps(p, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(a, odd, b));
  }
  static void from_split_order(float* p) {
    const F e = _mm512_loadu_ps(p), o = _mm512_loadu_ps(p + 16);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_storeu_ps(p, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(e, hi, o));
  }
  static F load_f16(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  // e4m3 -> f16 bits -> f32, 2^-8 too small, as VecAvx2::fp8_to_f16_bits (see there for the
  // bit layout): with each byte in the high half of a 16-bit lane, an arithmetic shift right by
  // one and clearing bit 14 (the sign's copy) give an f16 whose exponent field is one bit wider.
  // The 16 bytes go into the high halves with one broadcast load (no ALU uop) and one in-lane
  // byte shuffle (bytes 0-7 to the low 128 bits, 8-15 to the high ones; zeros in the low
  // halves). kNanCodes = false, for bytes known to hold no NaN code (has_fp8_nan), leaves out
  // the NaN step: code 0x7F/0xFF is 0x3F80 after the and; adding 0x80 carries into bit 14 for
  // that code alone, and one ternary-logic op (h | (carry & 0x4000)) makes it an f16 NaN.
  // Three ALU uops and the conversion per 16 values clean (five with the NaN step), where
  // load_fp8 takes nine; attention folds the 256 into its per-page scales (isa_core.inl, load_kv)
  // and reads whole 32-value chunks through load_fp8_split_over_256 instead.
  template <bool kNanCodes = true>
  static F load_fp8_over_256(const void* p) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    const __m256i to_high =
        _mm256_setr_epi8(-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1, 8, -1, 9, -1,
                         10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15);
    const __m256i w = _mm256_shuffle_epi8(x, to_high);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(-0x4001));
    if constexpr (kNanCodes) {
      const __m256i carry = _mm256_add_epi16(h, _mm256_set1_epi16(0x80));
      h = _mm256_ternarylogic_epi32(h, carry, _mm256_set1_epi16(0x4000), 0xF8);  // a | (b & c)
    }
    return _mm512_cvtph_ps(h);
  }
  // 32 fp8 values in one load, split as load_bf16_split splits bf16 (even: elements 0, 2, ..,
  // 30; odd: 1, 3, .., 31), each 2^-8 too small as load_fp8_over_256 gives them: the odd bytes
  // are already in the high half of their 16-bit lane, the even ones shifted there; then the
  // same shift, and and (optional) NaN step. Five ALU uops and two conversions per 32 values
  // clean (nine with the NaN step), where load_fp8_over_256 takes six and two (isa_core.inl
  // fp8_split).
  template <bool kNanCodes = true>
  static void load_fp8_split_over_256(const void* p, F& even, F& odd) {
    const __m256i w = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    const __m256i keep = _mm256_set1_epi16(static_cast<short>(0xBF80));  // sign, exp, mantissa
    __m256i he = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), keep);
    __m256i ho = _mm256_and_si256(_mm256_srai_epi16(w, 1), keep);
    if constexpr (kNanCodes) {
      const __m256i c80 = _mm256_set1_epi16(0x80), bit14 = _mm256_set1_epi16(0x4000);
      he = _mm256_ternarylogic_epi32(he, _mm256_add_epi16(he, c80), bit14, 0xF8);
      ho = _mm256_ternarylogic_epi32(ho, _mm256_add_epi16(ho, c80), bit14, 0xF8);
    }
    even = _mm512_cvtph_ps(he);
    odd = _mm512_cvtph_ps(ho);
  }
  // Whether `bytes` (a multiple of 16) of fp8 hold a NaN code (0x7F or 0xFF): the byte-wise max
  // of the magnitudes (sign cleared; 0x7F is the largest, see VecAvx2::max_magnitudes), an and
  // and a max per 64 bytes, the tail through a masked (non-faulting) load.
  static bool has_fp8_nan(const uint8_t* p, std::size_t bytes) {
    const __m512i mask = _mm512_set1_epi8(0x7F);
    __m512i acc = _mm512_setzero_si512();
    std::size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      acc = _mm512_max_epu8(acc, _mm512_and_si512(_mm512_loadu_si512(p + i), mask));
    }
    if (i < bytes) {
      const __mmask64 tail = (uint64_t{1} << (bytes - i)) - 1;
      acc = _mm512_max_epu8(acc, _mm512_and_si512(_mm512_maskz_loadu_epi8(tail, p + i), mask));
    }
    return _mm512_cmpeq_epi8_mask(acc, mask) != 0;
  }
  // e4m3 -> f16 bits (exponent field widened by one bit, so the value is 2^-8 of the true one,
  // subnormals included) -> f32, times 256; code 0x7F/0xFF is NaN.
  static F load_fp8(const void* p) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(mag, 7), sign);
    const F v = _mm512_mul_ps(_mm512_cvtph_ps(bits), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
  }

  static void store_bf16(void* p, F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan,
                              _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static void store_f16(void* p, F v) {
    _mm256_storeu_si256(static_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // The steps of numeric_formats.cpp float_to_fp8e4m3, lane-wise.
  static void store_fp8(void* p, F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i rounded =
        _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)),
                         _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1)));
    __m512i r = _mm512_sub_epi32(_mm512_srli_epi32(rounded, 20), _mm512_set1_epi32(120 << 3));
    const F shifted =
        _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f), _mm512_set1_ps(8388608.0f));
    const __m512i sub = _mm512_and_si512(_mm512_castps_si512(shifted), _mm512_set1_epi32(0xF));
    r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3C800000)), sub);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x43E00000)),
                              _mm512_set1_epi32(0x7E));
    r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)),
                              _mm512_set1_epi32(0x7F));
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_or_si512(r, sign)));
  }

  // Streaming baseline: 4 x 64 bytes per step, integer adds (no float assists on odd bit patterns).
  static uint64_t stream_read(const void* src, std::size_t bytes) {
    const auto* p = static_cast<const __m512i*>(src);
    const std::size_t n = bytes / 64;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
      s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + i + 1));
      s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + i + 2));
      s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + i + 3));
    }
    for (; i < n; ++i) s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
    const __m512i s = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
    return static_cast<uint64_t>(_mm512_reduce_add_epi64(s));
  }
};
