// AVX2 + FMA + F16C lane operations for isa_core.inl. Included inside an anonymous namespace by
// isa_avx2.cpp only; see isa.hpp for why nothing here may have external linkage.

struct VecAvx2 {
  using F = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRegisters = 16;  // vector registers the register blocks may fill

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F load_f32(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
  static void store_f32(void* p, F v) { _mm256_storeu_ps(static_cast<float*>(p), v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F abs(F a) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(a), _mm256_set1_epi32(0x7FFFFFFF)));
  }
  static F max_keep_nan(F acc, F a) {
    // maxps returns its second operand when either is NaN, so a NaN already in acc stays.
    return _mm256_blendv_ps(_mm256_max_ps(a, acc), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static float first(F a) { return _mm256_cvtss_f32(a); }
  static float reduce_add(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(F a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max_keep_nan(F a) {
    if (_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0) return __builtin_nanf("");
    return reduce_max(a);
  }

  // out[0..3] = horizontal sums of a, b, c, d, in two steps: pair_sums(a, b) folds two vectors
  // into one whose lanes hold partial sums of both, reduce_pair_sums finishes two such.
  static void reduce_add4(F a, F b, F c, F d, float* out) {
    reduce_pair_sums(pair_sums(a, b), pair_sums(c, d), out);
  }
  static F pair_sums(F a, F b) { return _mm256_hadd_ps(a, b); }
  static void reduce_pair_sums(F ab, F cd, float* out) {
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }

  // Same polynomial as VecAvx512::exp2.
  static F exp2(F x) {
    const F under = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    // Clamped with x as the second operand, which min/max return when it is NaN: NaN stays NaN.
    x = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-126.0f), x));
    const F n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm256_sub_ps(x, n);
    F p = _mm256_set1_ps(1.5252733804059841e-05f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381610e-04f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-02f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }

  static F load_bf16(const void* p) {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F load_f16(const void* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  // e4m3 -> f16 bits -> f32, times 256. With the byte in the high half of a 16-bit lane, an
  // arithmetic shift right by one puts the sign at bit 15 and the exponent and mantissa at bits
  // 13..7: an f16 whose exponent field is one bit wider, so its value is 2^-8 of the e4m3 one,
  // subnormals included, once bit 14 (the sign's copy) is cleared. Code 0x7F/0xFF (NaN) becomes
  // 0x3F80 there; adding 0x80 carries into bit 14 for that code alone, and setting bit 14 from
  // the carry makes it an f16 NaN. kNanCodes = false leaves that out (three of the seven
  // instructions), for bytes known to hold no NaN code (has_fp8_nan).
  template <bool kNanCodes = true>
  static __m128i fp8_to_f16_bits(__m128i high_bytes) {
    const __m128i h = _mm_and_si128(_mm_srai_epi16(high_bytes, 1), _mm_set1_epi16(-0x4001));
    if constexpr (!kNanCodes) return h;
    const __m128i carry =
        _mm_and_si128(_mm_add_epi16(h, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000));
    return _mm_or_si128(h, carry);
  }
  // The values 2^-8 too small (exact: e4m3's smallest subnormal, 2^-9, stays a normal float);
  // attention folds the 256 into its per-page scales (isa_core.inl, load_kv).
  template <bool kNanCodes = true>
  static F load_fp8_over_256(const void* p) {
    const __m128i x = _mm_loadl_epi64(static_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(fp8_to_f16_bits<kNanCodes>(_mm_unpacklo_epi8(_mm_setzero_si128(), x)));
  }
  static F load_fp8(const void* p) {
    return _mm256_mul_ps(load_fp8_over_256(p), _mm256_set1_ps(256.0f));
  }
  // Whether `bytes` (a multiple of 16) of fp8 hold a NaN code (0x7F or 0xFF: magnitude 0x7F, the
  // largest, see max_magnitudes). Two instructions per 32 bytes, against three per 8 values for
  // the NaN step of the conversion; run per 4-token group of K and per tile of V.
  static bool has_fp8_nan(const uint8_t* p, std::size_t bytes) {
    std::size_t i = 0;
    const __m256i acc = max_magnitudes<1>(p, bytes, &i);
    __m128i m = _mm_max_epu8(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    if (i < bytes) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      m = _mm_max_epu8(m, _mm_and_si128(x, _mm_set1_epi8(0x7F)));
    }
    return _mm_movemask_epi8(_mm_cmpeq_epi8(m, _mm_set1_epi8(0x7F))) != 0;
  }

  static void store_bf16(void* p, F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void store_f16(void* p, F v) {
    _mm_storeu_si128(static_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // f32 -> e4m3 codes (RNE, saturating at +-448, NaN -> 0x7F | sign), one per 32-bit lane.
  // Rounding |x| to e4m3's step is one float add: for |x| = 2^e * 1.f with e >= -6 the step is
  // 2^(e-3), the ulp of M = 2^(e+20), so |x| + M rounds |x| to it (and to 2^-9, e4m3's subnormal
  // step, with M = 2^14 for every smaller e). The code is then bits(|x| + M) - bits(M) (the
  // significand in steps, 8 + mantissa for a normal) plus the exponent taken from M,
  // (bits(M) >> 20) - 1128: one expression for normals and subnormals, and a mantissa that rounds
  // up to 8 carries into the exponent by itself. 15 instructions, where the previous encoder
  // (separate normal and subnormal paths, each saturation a compare and a blend) took 19 and a
  // store through general registers; equal to the scalar encoder for all 2^32 inputs
  // (NumericFormatsExhaustive, label slow).
  static __m256i fp8_codes(F v) {
    const __m256i bits = _mm256_castps_si256(v);
    const F mag = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
    // 448 is the largest finite e4m3 value; mag as the second operand keeps NaN out of the min
    // (it is replaced below).
    const F a = _mm256_min_ps(_mm256_set1_ps(448.0f), mag);
    const __m256i exponent =
        _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), _mm256_set1_epi32(0x7F800000)),
                         _mm256_set1_epi32(121 << 23));  // 2^-6, e4m3's smallest normal
    const __m256i m = _mm256_add_epi32(exponent, _mm256_set1_epi32(20 << 23));
    const __m256i rounded = _mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m)));
    __m256i code =
        _mm256_add_epi32(_mm256_sub_epi32(rounded, m),
                         _mm256_sub_epi32(_mm256_srli_epi32(m, 20), _mm256_set1_epi32(1128)));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F),
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm256_or_si256(code,
                           _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
  }
  static void store_fp8(void* p, F v) {
    // The low byte of each lane to the bottom of its 128-bit half, then the halves together.
    const __m256i low_bytes =
        _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                         -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i bytes = _mm256_shuffle_epi8(fp8_codes(v), low_bytes);
    const __m256i packed =
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    _mm_storel_epi64(static_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  // 32 values at once: the codes (0..255) packed by two unsigned-saturating packs, whose
  // per-128-bit-lane order one permute undoes; one 32-byte store.
  static void store_fp8x4(void* p, F a, F b, F c, F d) {
    const __m256i ab = _mm256_packus_epi32(fp8_codes(a), fp8_codes(b));
    const __m256i cd = _mm256_packus_epi32(fp8_codes(c), fp8_codes(d));
    const __m256i abcd = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(static_cast<__m256i*>(p), abcd);
  }

  // Lane-wise maxima of the magnitudes (sign bits cleared) of elements of kBytes bytes, over the
  // whole 32-byte blocks of `bytes`; *done = the bytes they cover. Non-negative values of
  // IEEE-style formats, e4m3 included, order like their bit patterns, inf above every finite
  // value and NaN above inf, so an integer max finds the abs max and any NaN at once: an and and
  // a max per 32 bytes.
  template <std::size_t kBytes>
  static __m256i max_magnitudes(const uint8_t* p, std::size_t bytes, std::size_t* done) {
    const __m256i mask = magnitude_mask<kBytes>();
    __m256i acc = _mm256_setzero_si256();
    std::size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
      acc = max_unsigned<kBytes>(
          acc, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), mask));
    }
    *done = i;
    return acc;
  }
  // The bit pattern (sign cleared) of the largest magnitude among n elements of kBytes bytes
  // (abs_max; the float max that keeps NaN took a widening, an and, a max, a compare and a blend
  // per 8 values).
  template <std::size_t kBytes>
  static uint32_t max_magnitude_bits(const uint8_t* p, std::size_t n) {
    const std::size_t bytes = n * kBytes;
    std::size_t i = 0;
    __m256i acc = max_magnitudes<kBytes>(p, bytes, &i);
    alignas(32) uint8_t lanes[32] = {};
    __builtin_memcpy(lanes, p + i, bytes - i);  // a zero-padded tail: zeros never raise the max
    acc = max_unsigned<kBytes>(
        acc, _mm256_and_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)),
                              magnitude_mask<kBytes>()));
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    uint32_t best = 0;
    for (std::size_t j = 0; j < 32; j += kBytes) {
      uint32_t lane = 0;
      __builtin_memcpy(&lane, lanes + j, kBytes);
      best = lane > best ? lane : best;
    }
    return best;
  }
  template <std::size_t kBytes>
  static __m256i magnitude_mask() {
    static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4);
    if constexpr (kBytes == 4) return _mm256_set1_epi32(0x7FFFFFFF);
    if constexpr (kBytes == 2) return _mm256_set1_epi16(0x7FFF);
    return _mm256_set1_epi8(0x7F);
  }
  template <std::size_t kBytes>
  static __m256i max_unsigned(__m256i a, __m256i b) {
    if constexpr (kBytes == 4) return _mm256_max_epu32(a, b);
    if constexpr (kBytes == 2) return _mm256_max_epu16(a, b);
    return _mm256_max_epu8(a, b);
  }

  static uint64_t stream_read(const void* src, std::size_t bytes) {
    const auto* p = static_cast<const __m256i*>(src);
    const std::size_t n = bytes / 32;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(p + i));
      s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(p + i + 1));
      s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(p + i + 2));
      s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(p + i + 3));
    }
    for (; i < n; ++i) s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(p + i));
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return static_cast<uint64_t>(_mm_cvtsi128_si64(h)) +
           static_cast<uint64_t>(_mm_extract_epi64(h, 1));
  }
};
