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
  static F load_f16(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
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
