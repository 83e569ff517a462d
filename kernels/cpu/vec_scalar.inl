// One-lane "vector" for isa_core.inl: the portable fallback, built with the library's baseline
// flags (so it may use the shared scalar conversions of numeric_formats.hpp).

struct VecScalar {
  using F = float;
  static constexpr int kWidth = 1;
  static constexpr int kRegisters = 16;  // vector registers the register blocks may fill

  static F zero() { return 0.0f; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static F load_f32(const void* p) { return load_as_float(p, Dtype::kF32, 0); }
  static void store_f32(void* p, F v) { store_from_float(p, Dtype::kF32, 0, v); }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F fmadd(F a, F b, F c) { return std::fma(a, b, c); }
  static F max(F a, F b) { return a > b ? a : b; }
  static F abs(F a) { return std::fabs(a); }
  static F max_keep_nan(F acc, F a) { return std::isnan(a) ? a : (a > acc ? a : acc); }
  static float first(F a) { return a; }
  static float reduce_add(F a) { return a; }
  static float reduce_max(F a) { return a; }
  static float reduce_max_keep_nan(F a) { return a; }
  static void reduce_add4(F a, F b, F c, F d, float* out) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
  static F exp2(F x) { return x < -126.0f ? 0.0f : std::exp2(x > 127.0f ? 127.0f : x); }

  static F load_bf16(const void* p) { return load_as_float(p, Dtype::kBF16, 0); }
  static F load_f16(const void* p) { return load_as_float(p, Dtype::kF16, 0); }
  static F load_fp8(const void* p) { return load_as_float(p, Dtype::kFP8E4M3, 0); }
  static void store_bf16(void* p, F v) { store_from_float(p, Dtype::kBF16, 0, v); }
  static void store_f16(void* p, F v) { store_from_float(p, Dtype::kF16, 0, v); }
  static void store_fp8(void* p, F v) { store_from_float(p, Dtype::kFP8E4M3, 0, v); }

  static uint64_t stream_read(const void* src, std::size_t bytes) {
    const auto* p = static_cast<const uint64_t*>(src);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (std::size_t i = 0; i + 4 <= bytes / 8; i += 4) {
      s0 += p[i];
      s1 += p[i + 1];
      s2 += p[i + 2];
      s3 += p[i + 3];
    }
    return s0 + s1 + s2 + s3;
  }
};
