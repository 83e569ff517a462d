// The CPU kernels, written once over a lane type V (vec_scalar.inl, vec_avx2.inl, vec_avx512.inl)
// and compiled once per instruction set. Included inside an anonymous namespace in namespace
// kvtier::kernels::cpu, after V's definition; see isa.hpp for the linkage rules this obeys.
//
// Attention of a work item walks its KV range in tiles of kTileTokens tokens. A tile's K is scored
// in address order: 4 tokens (four consecutive rows of a page) at a time, every KV head of them,
// in register blocks of 4 rows x 4 tokens with K widened in registers as it is loaded (bf16 and
// fp8 on AVX-512: one load per 2 x lane-width values, split into even and odd elements, see
// bf16_split and fp8_split), into the scores of all heads; on AVX-512 a block's 16 sums come
// out of one transposing tree (reduce_add4x4) rather than 16 horizontal sums. Then one
// online-softmax rescale per row per tile (not per token): on AVX-512, in tiles every row sees
// whole (all of decode), 16 rows of all heads at a time with the maxima, alphas and sums
// lane-wise (softmax_rows_wide), else row by row, head by head. Then the weighted V sum head by
// head in blocks of 4 rows (x 64 dims for AVX-512 bf16 and fp8, x 32 otherwise), each V vector
// widened once per block. fp8 page scales are folded into the scores and the weights, never
// applied per element.
// The causal mask leaves masked tokens out of the V sum (never weight 0 times a V that may be inf
// or NaN) and is applied after the K scale (never -inf times a zero scale); tiles it does not cut,
// every decode tile among them, take the unmasked loops unchanged.
// While a tile computes, the whole next tile (K then V, address order) is prefetched into L2 a
// few lines at a time. Each score and each accumulation is the same sum in the same order as in
// a head-by-head walk, so the order of the walk does not change a bit of the result.
// Measured with `kvtier-bench attn --access-order` (the decode reads alone, no arithmetic, same
// items, threads and scattered pages; one Zen 4 core, bf16, GQA 4): head by head the reads run at
// 0.66-0.70 of a streaming read (0.63-0.66 with the one-step L1 prefetches the kernel had), 4
// tokens x every head or address order at 0.83-0.86: the per-head order cost the reads a fifth.
// The kernel went from 0.51 (avx512) / 0.51 (avx512_bf16) to 0.57-0.58 / 0.60-0.61 of the
// streaming read, GQA 1 from 0.55 to 0.77; fp8 (0.23, its conversions) and prefill unchanged.
// With the pages in L3 it runs at 26-31 GiB/s per core, so from DRAM about a quarter of the time
// is still exposed misses. Rejected: P.V in 4-token groups across heads too (o loaded and
// stored four times per tile: 0.56 against 0.60, avx512_bf16); the next tile into L1
// (prefetcht0: 64 KiB overflows L1; 0.50-0.57, unsteady, against 0.58); no software prefetch,
// trusting the hardware prefetchers inside a page (0.30), or only each row's first 256 bytes to
// start them (0.28); a second, just-in-time L1 prefetch of the next 4-token group and the next
// head's V rows beside the L2 one (no gain, avx512_bf16 0.58-0.61 against 0.60-0.65); issuing
// the next tile's lines during the K phase only (0.52 against 0.56); two tiles of lead (the tile
// after next streamed into L2, the next drained up front: 0.58-0.59 against 0.56-0.57 on one core,
// 0.77 both on two, within noise). Two threads: 36.2 against 28.0-28.5 GiB/s for the head-by-head
// kernel while other work shared the memory (streaming read 45 GiB/s); on a quiet machine (76
// GiB/s) 43.5 GiB/s, 0.56-0.57.
// With bf16_split, the wider P.V blocks, the score tree and softmax_rows_wide, on a 2-vCPU
// Sapphire Rapids-class VM (bf16, 8 KV heads x 128, GQA 4, 32 x 4096 tokens; medians of 7 runs,
// old and new builds alternating, while other work shared the machine): two threads 0.51 -> 0.58
// of the streaming read, one thread 0.54 -> 0.60 (7.4 -> 8.1 GiB/s), GQA 8 0.35 -> 0.44, f16
// 0.51 -> 0.54, fp8 unchanged (0.26; bound by its conversion, see below); with the pages in L2
// 11.1 -> 13.5 GiB/s. What is left from DRAM: in L2 the kernel outruns a DRAM streaming read
// (17-18 against 14 GiB/s on one core), yet from DRAM its time is close to the sum of the two,
// not the larger: the L2 prefetches overlap the arithmetic poorly (see TilePrefetch).
// Earlier, when the walk went head by head with one step of L1 prefetch, rejected: widening each
// tile to an f32 scratch first (one compute path for every dtype, but an extra store and reload of
// every element, with the misses exposed in the conversion loop), and prefetching a whole tile of
// all heads at once (it overflows L1 and the miss queues). Measured on one Zen 4 core, bf16,
// head_dim 128, pages in DRAM: GQA 4 runs at 9.8 GiB/s without prefetching, 20 GiB/s with it, 23-25
// GiB/s with everything in cache, which is the FMA limit (2 x group x head_dim FMAs per token and
// head) against 37 GiB/s of streaming read; GQA 1 at 22 GiB/s from DRAM, 37 GiB/s from cache,
// limited by the strided (per head) page reads. Two steps of lead gain nothing.
//
// bf16 KV on lane types with kBf16Dot (avx512_bf16) takes a dot-product path instead (see the
// section before locate_tile): vdpbf16ps multiplies 32 bf16 pairs into 16 fp32 lanes, so neither
// K nor V is widened and each instruction does the work of two FMAs. It needs q and the softmax
// weights in bf16, which is the rounding GPU attention kernels do (Q arrives in bf16; P is cast to
// bf16 for the PV product): q is rounded once per item after scaling (each score moves by
// |sum_d (q~_d - q_d) k_d| <= 2^-8 sum_d |q_d k_d|), each weight p_t by a factor (1 + e),
// |e| <= 2^-8, and l sums the rounded weights, so o/l is an exact softmax average under weights
// perturbed by (1 + eta_t): |o~_i - o_i| <= sum_t w_t |eta_t| |v_t,i - o_i| / (1 - max |eta|)
// (derived and checked per element in tests/kernels/attention_test.cpp). Accumulation stays fp32.
// Measured on one Zen 4 core (vdpbf16ps zmm issues once per cycle, like a zmm FMA, so it halves
// the multiply-add instructions and drops the widening): GQA 4, head_dim 128, in cache 29 GiB/s
// against 24 for the fp32 path; chunked prefill 370 against 270 GFLOP/s on two cores. From DRAM
// the two are equal (20 GiB/s, 0.53 of a 38 GiB/s streaming read, one core; 0.50 on two): what is
// left is not arithmetic but latency. In a profile of the in-cache run the score blocks (their
// 16-lane horizontal sums now cost about as much as their dot products) take a third of the time,
// softmax and P.V a fifth each, prefetching an eighth. Tried and dropped: the next tile streamed
// into L2 (prefetcht1, all heads, address order) beside the one-step L1 queue (DRAM ratio
// unchanged, in cache 25 GiB/s), and the L2 stream alone (in cache 32, DRAM 15.5 GiB/s); both
// with K still read head by head. With K scored in address order the L2 stream alone is what
// the kernel now does.

// fp8 KV is bound by its conversion: e4m3 -> f16 bits -> f32 took eleven instructions per vector,
// against the four FMAs (GQA 4) that use it. On lane types that provide the pieces (vec_avx2.inl,
// vec_avx512.inl; see has_fp8_over_256 below) the conversion is cut to four instructions (seven
// for rows holding a NaN code; on AVX-512 five ALU uops and two conversions per 32 values, nine
// and two with the NaN step, see fp8_split): the values are loaded 2^-8 too small with the 256
// folded into the per-page scales (bit-identical), and rows that a cheap scan (two instructions
// per 32 bytes, per 64 on AVX-512) finds free of NaN codes skip the NaN step; a row holding one
// takes the exact conversion, so NaN still poisons what it should. Measured on one AVX2-only Zen 3
// core, two builds alternating in one process, 4096-token items: 1.31x from the shorter conversion
// and the folded scale, 1.11-1.15x more from the scan. Decode over fp8 now takes about as long as
// over bf16 for the same tokens (it took 1.3-1.4x as long). Tried: converting 16 values per load
// (one load, two conversions: no gain). AVX-512 took the exact conversion (nine ALU uops per 16
// values) until it got the same pieces, with fp8 read in split order (fp8_split) and the NaN scan
// 64 bytes at a time. On the 2-vCPU Sapphire Rapids-class VM (8 KV heads x 128, GQA 4, 32 x 4096
// tokens; medians of 7 runs, old and new builds alternating, while other work shared the machine):
// two threads 0.27 -> 0.34 of the streaming read (7.1 -> 9.0 GiB/s), one thread 0.30 -> 0.38 (4.0
// -> 4.9 GiB/s, 5 runs), chunked prefill 75 -> 110 GFLOP/s (5 runs); bf16 unchanged (0.58 / 0.59, 3
// runs). One pinned thread, pages in L3 (4 x 1024 tokens, best of 300 rounds, 8 pairs): 1.37x;
// split order against the 16-value load (a broadcast and a byte shuffle per 16 values): 1.05x of
// that. Per element fp8 now runs about as fast as bf16; what is left is the FMAs (each fp8 byte is
// an element) and the rest of the kernel, not the conversion.

// Register blocks must stay in registers: GCC at -O2 does not fully unroll the small constant
// loops over them by itself and keeps the blocks in memory instead (measured 3x slower).
#define KVTIER_UNROLL _Pragma("GCC unroll 16")
// The P.V helpers are inlined into the tile loop, where GCC put them by itself until the masked
// (prefill-only) paths gave them more callers: then it kept them out of line, and in-cache decode
// lost 1.5-2 % (avx512_bf16, avx2 fp8; one Zen 4 core, two builds alternating).
#define KVTIER_ALWAYS_INLINE inline __attribute__((always_inline))

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

// Whether attention over D KV takes the dot-product path (see the section before locate_tile):
// bf16 on lane types that set kBf16Dot (vec_avx512bf16.inl), fp8 on those that also set kFp8Dot.
template <class V, Dtype D>
constexpr bool dot_kv() {
  if constexpr (D == Dtype::kBF16 && requires { V::kBf16Dot; }) {
    return V::kBf16Dot;
  } else if constexpr (D == Dtype::kFP8E4M3 && requires { V::kFp8Dot; }) {
    return V::kFp8Dot;
  } else {
    return false;
  }
}

// fp8 KV in attention, on lane types that provide the pieces (vec_avx2.inl, vec_avx512.inl), off
// the dot-product path (which widens fp8 exactly by table, NaN codes included):
// - load_fp8_over_256 loads the values 2^-8 too small, one multiply fewer per vector; attention
//   multiplies its per-page scales by kv_scale_factor<V, D>() instead. Scaling by a power of two
//   commutes with rounding, so the scores and weights are bit for bit those of the exact load.
// - has_fp8_nan tells whether rows hold a NaN code (0x7F/0xFF); the rows of a 4-token group (K)
//   or of a tile (V) that hold none are converted without the NaN step (load_kv<..., false>),
//   which saves more than the scan costs. Rows that hold one take the exact conversion.
template <class V>
constexpr bool has_fp8_over_256() {
  return requires(const void* p) { V::load_fp8_over_256(p); };
}

template <class V, Dtype D>
constexpr bool scans_fp8_nan() {
  return D == Dtype::kFP8E4M3 && has_fp8_over_256<V>() && !dot_kv<V, D>() &&
         requires(const uint8_t* p, std::size_t n) {
    V::has_fp8_nan(p, n);
  };
}

template <class V, Dtype D>
constexpr float kv_scale_factor() {
  return D == Dtype::kFP8E4M3 && has_fp8_over_256<V>() && !dot_kv<V, D>() ? 256.0f : 1.0f;
}

// KV elements as attention reads them: load_elems, but fp8 kv_scale_factor() times too small.
// kNanCodes = false: the bytes hold no fp8 NaN code (scans_fp8_nan).
template <class V, Dtype D, bool kNanCodes = true>
inline typename V::F load_kv(const uint8_t* p) {
  if constexpr (D == Dtype::kFP8E4M3 && has_fp8_over_256<V>()) {
    return V::template load_fp8_over_256<kNanCodes>(p);
  } else {
    return load_elems<V, D>(p);
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

template <class V>
constexpr bool has_store_fp8x4() {
  return requires(uint8_t * p, typename V::F v) { V::store_fp8x4(p, v, v, v, v); };
}

// dst[i] = narrow<D>(value<S>(src[i]) * scale). Widening is exact, so the only rounding is the
// multiply's and the narrowing's, as with a detour through f32. fp8 output goes 32 values per
// store where the lane type packs them (store_fp8x4).
template <class V, Dtype S, Dtype D>
void convert_t(const uint8_t* src, float scale, uint8_t* dst, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  constexpr std::size_t kSrcBytes = elem_bytes<S>();
  constexpr std::size_t kDstBytes = elem_bytes<D>();
  const auto s = V::set1(scale);
  const auto value = [&](const uint8_t* p) { return V::mul(load_elems<V, S>(p), s); };
  std::size_t i = 0;
  if constexpr (D == Dtype::kFP8E4M3 && has_store_fp8x4<V>()) {
    for (; i + 4 * kW <= n; i += 4 * kW) {
      const uint8_t* p = src + i * kSrcBytes;
      V::store_fp8x4(dst + i, value(p), value(p + kW * kSrcBytes), value(p + 2 * kW * kSrcBytes),
                     value(p + 3 * kW * kSrcBytes));
    }
  }
  for (; i + kW <= n; i += kW) store_elems<V, D>(dst + i * kDstBytes, value(src + i * kSrcBytes));
  if (i < n) {
    alignas(64) uint8_t in[kW * 4] = {};
    alignas(64) uint8_t out[kW * 4];
    __builtin_memcpy(in, src + i * kSrcBytes, (n - i) * kSrcBytes);
    store_elems<V, D>(out, value(in));
    __builtin_memcpy(dst + i * kDstBytes, out, (n - i) * kDstBytes);
  }
}

template <class V, Dtype S>
void convert_from(const uint8_t* src, float scale, uint8_t* dst, Dtype dst_dtype, std::size_t n) {
  switch (dst_dtype) {
    case Dtype::kF32: return convert_t<V, S, Dtype::kF32>(src, scale, dst, n);
    case Dtype::kF16: return convert_t<V, S, Dtype::kF16>(src, scale, dst, n);
    case Dtype::kBF16: return convert_t<V, S, Dtype::kBF16>(src, scale, dst, n);
    case Dtype::kFP8E4M3: return convert_t<V, S, Dtype::kFP8E4M3>(src, scale, dst, n);
  }
}

template <class V>
void convert(const void* src, Dtype src_dtype, float scale, void* dst, Dtype dst_dtype,
             std::size_t n) {
  const auto* from = static_cast<const uint8_t*>(src);
  auto* to = static_cast<uint8_t*>(dst);
  switch (src_dtype) {
    case Dtype::kF32: return convert_from<V, Dtype::kF32>(from, scale, to, dst_dtype, n);
    case Dtype::kF16: return convert_from<V, Dtype::kF16>(from, scale, to, dst_dtype, n);
    case Dtype::kBF16: return convert_from<V, Dtype::kBF16>(from, scale, to, dst_dtype, n);
    case Dtype::kFP8E4M3: return convert_from<V, Dtype::kFP8E4M3>(from, scale, to, dst_dtype, n);
  }
}

template <class V>
void to_f32(const void* src, Dtype dtype, float scale, float* dst, std::size_t n) {
  convert<V>(src, dtype, scale, dst, Dtype::kF32, n);
}

template <class V>
void from_f32(const float* src, float scale, Dtype dtype, void* dst, std::size_t n) {
  convert<V>(src, Dtype::kF32, scale, dst, dtype, n);
}

template <class V>
constexpr bool has_max_magnitude_bits() {
  return requires(const uint8_t* p, std::size_t n) { V::template max_magnitude_bits<2>(p, n); };
}

template <class V, Dtype D>
float abs_max_t(const uint8_t* src, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  constexpr std::size_t kEs = elem_bytes<D>();
  if constexpr (has_max_magnitude_bits<V>()) {
    // The largest magnitude's bit pattern, widened as one element (NaN stays NaN).
    const uint32_t bits = V::template max_magnitude_bits<kEs>(src, n);
    alignas(64) uint8_t one[kW * 4] = {};
    __builtin_memcpy(one, &bits, kEs);
    return V::first(load_elems<V, D>(one));
  } else {
    auto acc = V::zero();
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) {
      acc = V::max_keep_nan(acc, V::abs(load_elems<V, D>(src + i * kEs)));
    }
    if (i < n) {
      alignas(64) uint8_t in[kW * 4] = {};
      __builtin_memcpy(in, src + i * kEs, (n - i) * kEs);
      acc = V::max_keep_nan(acc, V::abs(load_elems<V, D>(in)));
    }
    return V::reduce_max_keep_nan(acc);
  }
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

// Into L2 (prefetcht1): a tile is 64 KiB of K and V, more than an L1 holds, and L2 hits are
// what the out-of-order window hides well. GCC deduces that a function whose only effect is
// __builtin_prefetch is "const" and deletes the calls, prefetches and all; an asm statement
// cannot be deleted.
inline void prefetch_line_l2(const uint8_t* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// The cache lines of the next tile (K rows, then V rows, in address order), handed out a few at a
// time so that the requests are spread over this tile's arithmetic rather than issued in one
// burst that fills the miss queues and stalls it. Frames are scattered, so the hardware
// prefetchers lose the stream at every page (and, measured, barely follow it within one while
// the arithmetic runs: without these prefetches decode runs at 0.30 of a streaming read).
// Rejected on a Sapphire Rapids-class vCPU (bf16, GQA 4, one thread, 5 runs each, two builds
// alternating): every other line only, leaving the pair line to the L2's adjacent-line
// prefetcher (0.51 against 0.60); the same lines in half the calls, i.e. bursts twice as large
// over the tile's first half (0.52 against 0.60); a second call half way through each P.V chunk,
// bursts half as large (0.57 against 0.61).
class TilePrefetch {
 public:
  TilePrefetch() = default;
  // `rows`: `count` K rows of `row_bytes` each (every head of a token); V rows are `v_offset`
  // further. `calls`: the issue() calls the tile will make.
  TilePrefetch(const uint8_t* const* rows, uint32_t count, std::size_t row_bytes,
               std::size_t v_offset, uint32_t calls)
      : rows_(rows), count_(count), row_bytes_(row_bytes), v_offset_(v_offset) {
    const std::size_t lines = 2 * count * ((row_bytes + 63) / 64);
    per_call_ = calls == 0 ? static_cast<uint32_t>(lines)
                           : static_cast<uint32_t>((lines + calls - 1) / calls);
    half_ = count == 0 ? 2 : 0;
  }
  void issue() { issue(per_call_); }
  void drain() { issue(~0u); }

 private:
  // The lines of one row go out in a tight loop, the row and half bookkeeping once per row
  // rather than once per line (a tile of 8 heads x 128 bf16 is 1024 lines). Measured on an
  // AVX2-only Zen core: decode 3-5 % faster with the pages in cache, the same from DRAM.
  void issue(uint32_t n) {
    while (n > 0 && half_ < 2) {
      const uint8_t* row = rows_[row_] + (half_ != 0 ? v_offset_ : 0);
      const std::size_t left = row_bytes_ - offset_;
      const std::size_t span = std::size_t{n} * 64 < left ? std::size_t{n} * 64 : left;
      const std::size_t end = offset_ + span;
      for (std::size_t o = offset_; o < end; o += 64) prefetch_line_l2(row + o);
      n -= static_cast<uint32_t>((span + 63) / 64);
      offset_ = end;
      if (offset_ >= row_bytes_) {
        offset_ = 0;
        if (++row_ == count_) {
          row_ = 0;
          ++half_;
        }
      }
    }
  }

  const uint8_t* const* rows_ = nullptr;
  uint32_t count_ = 0;
  std::size_t row_bytes_ = 0;
  std::size_t v_offset_ = 0;
  uint32_t per_call_ = 0;
  uint32_t half_ = 2;  // 0: K rows, 1: V rows, 2: done
  uint32_t row_ = 0;
  std::size_t offset_ = 0;
};

// bf16 K and V on the exact fp32 path of lane types with load_bf16_split: a row's full chunks of
// 2 x kWidth elements are loaded with one load each and split into even and odd elements (two
// one-uop ALU ops, where load_bf16 needs a shuffle and a shift per kWidth elements). q and o are
// kept in the same split order for the whole item (to_split_order at its start, o put back at its
// end); a head_dim that is an odd multiple of kWidth keeps its last kWidth dims in natural order.
// Each score then adds its products in another order (even dims, then odd ones, per lane); every
// product and the fp32 accumulation stay exact-input fp32, within the tests' tolerances.
// Measured alone (one Sapphire Rapids-class vCPU, GQA 4, head_dim 128, pages in L3, two builds
// alternating): 13.3 -> 13.5 GiB/s; small, since the FMAs, not the widening, were the bulk.
// Not on AVX2 (no load_bf16_split in vec_avx2.inl): the same machine with KVTIER_CPU_ISA=avx2,
// 3 runs alternating, decode 0.56 -> 0.54 of the streaming read and prefill 70 -> 63 GFLOP/s.
template <class V, Dtype D>
constexpr bool bf16_split() {
  if constexpr (D != Dtype::kBF16 || dot_kv<V, D>()) {
    return false;
  } else {
    return requires(const void* p, typename V::F& f) { V::load_bf16_split(p, f, f); };
  }
}

// fp8 K and V in the same split order, on lane types with load_fp8_split_over_256 (AVX-512): 32
// bytes in one load, the odd bytes already in the high half of each 16-bit lane (the position
// the f16 trick of load_fp8_over_256 wants), the even ones one shift away, so no byte shuffle;
// the values as load_kv gives them (2^-8 too small, the NaN step only where kNanCodes). With it
// come the same 4 x 4 P.V blocks (wide_pv_blocks) and the q / o reordering as bf16's.
// Measured (one pinned Sapphire Rapids-class vCPU, pages in L3, best of 300 rounds, 8 pairs of
// runs): 1.05x against load_fp8_over_256 per 16 values in natural order.
template <class V, Dtype D>
constexpr bool fp8_split() {
  return D == Dtype::kFP8E4M3 && has_fp8_over_256<V>() && !dot_kv<V, D>() &&
         requires(const void* p, typename V::F& f) {
    V::template load_fp8_split_over_256<true>(p, f, f);
  };
}

// Whether attention reads D in split order (bf16_split or fp8_split). The lane type then also
// puts 2 x kWidth floats into that order and back (V::to_split_order, V::from_split_order).
template <class V, Dtype D>
constexpr bool split_kv() {
  return bf16_split<V, D>() || fp8_split<V, D>();
}

// Whether accumulate_rows takes P.V in 4-row blocks of 4 x kWidth dims (see there) rather than 2.
template <class V, Dtype D>
constexpr bool wide_pv_blocks() {
  return split_kv<V, D>() && V::kRegisters >= 32;
}

// 2 x kWidth elements at p, split into even and odd elements, as load_kv would widen them.
template <class V, Dtype D, bool kNanCodes>
KVTIER_ALWAYS_INLINE void load_kv_split(const uint8_t* p, typename V::F& even, typename V::F& odd) {
  if constexpr (fp8_split<V, D>()) {
    V::template load_fp8_split_over_256<kNanCodes>(p, even, odd);
  } else {
    V::load_bf16_split(p, even, odd);
  }
}

// scores[r][t] = the horizontal sum of acc[r][t].
template <class V, int RB, int TB>
inline void store_scores(typename V::F (&acc)[RB][TB], float* scores) {
  if constexpr (RB == 4 && TB == 4 &&
                requires(float* out) { V::reduce_add4x4(acc, out, std::size_t{kTileTokens}); }) {
    V::reduce_add4x4(acc, scores, kTileTokens);  // one transposing tree for the whole block
    return;
  }
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    if constexpr (TB == 4) {
      V::reduce_add4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], scores + r * kTileTokens);
    } else {
      KVTIER_UNROLL for (int t = 0; t < TB; ++t) {
        scores[r * kTileTokens + t] = V::reduce_add(acc[r][t]);
      }
    }
  }
}

// acc[r][t] = the lane-wise partial sums of q_r . k_t for an RB x TB block; q rows are `dim`
// floats apart, k_t are rows of the KV dtype, widened in registers as they are loaded.
template <class V, Dtype D, int RB, int TB, bool kNanCodes>
inline void score_sums(const float* q, const uint8_t* const* k, uint32_t dim,
                       typename V::F (&acc)[RB][TB]) {
  constexpr std::size_t kEs = elem_bytes<D>();
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::zero();
  }
  uint32_t d = 0;
  if constexpr (split_kv<V, D>()) {
    for (; d + 2 * V::kWidth <= dim; d += 2 * V::kWidth) {
      typename V::F ke[TB], ko[TB];
      KVTIER_UNROLL for (int t = 0; t < TB; ++t) {
        load_kv_split<V, D, kNanCodes>(k[t] + d * kEs, ke[t], ko[t]);
      }
      KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
        const auto qe = V::load(q + r * dim + d);
        KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::fmadd(qe, ke[t], acc[r][t]);
        const auto qo = V::load(q + r * dim + d + V::kWidth);
        KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::fmadd(qo, ko[t], acc[r][t]);
      }
    }
  }
  for (; d < dim; d += V::kWidth) {
    typename V::F kv[TB];
    KVTIER_UNROLL for (int t = 0; t < TB; ++t) kv[t] = load_kv<V, D, kNanCodes>(k[t] + d * kEs);
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      const auto qv = V::load(q + r * dim + d);
      KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::fmadd(qv, kv[t], acc[r][t]);
    }
  }
}

// Lane types whose 4-way horizontal sum comes in two halves (pair_sums, then reduce_pair_sums):
// a 4 x 4 score block can then be computed as two 4 x 2 blocks, each pair of tokens reduced to
// one register as soon as it is done, with the same operations in the same order.
template <class V>
constexpr bool has_pair_sums() {
  return requires(typename V::F a, float* out) {
    V::pair_sums(a, a);
    V::reduce_pair_sums(a, a, out);
  };
}

// scores[r][t] = q_r . k_t for an RB x TB block. A block holds RB * TB accumulators, TB widened
// K vectors and one q vector in registers: 21 for 4 x 4, which fits AVX-512's 32 registers but not
// AVX2's 16. There GCC spilled accumulators inside the loop over dims; two 4 x 2 halves (11
// registers each) run without spills, bit-identical. Measured on one AVX2-only Zen 3 core, two
// builds alternating in one process: decode 1.05-1.07x with the pages in L2, prefill 1.04x, from
// DRAM within the noise. (A plain 4 x 2 block, reduced per score, lost 3 % in prefill.)
template <class V, Dtype D, int RB, int TB, bool kNanCodes>
inline void score_block(const float* q, const uint8_t* const* k, uint32_t dim, float* scores) {
  constexpr bool kSpills = RB * TB + TB + 1 > V::kRegisters;
  if constexpr (kSpills && TB == 4 && has_pair_sums<V>()) {
    typename V::F acc[RB][2];
    typename V::F first_pair[RB];
    score_sums<V, D, RB, 2, kNanCodes>(q, k, dim, acc);
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) first_pair[r] = V::pair_sums(acc[r][0], acc[r][1]);
    score_sums<V, D, RB, 2, kNanCodes>(q, k + 2, dim, acc);
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      V::reduce_pair_sums(first_pair[r], V::pair_sums(acc[r][0], acc[r][1]),
                          scores + r * kTileTokens);
    }
  } else {
    typename V::F acc[RB][TB];
    score_sums<V, D, RB, TB, kNanCodes>(q, k, dim, acc);
    store_scores<V, RB, TB>(acc, scores);
  }
}

// o_r = o_r * alpha_r + sum_t p[r][t] * v_t for RB rows over DC vectors of dims at once: RB * DC
// independent accumulators, so the chain of FMAs over the tokens never waits on FMA latency (one
// row alone would run at a quarter of the FMA rate). v_t widened once per row block.
template <class V, Dtype D, int RB, int DC, bool kNanCodes>
KVTIER_ALWAYS_INLINE void accumulate_chunk(const float* p, const float* alpha,
                                           const uint8_t* const* v, uint32_t tokens, uint32_t dim,
                                           uint32_t d, float* o) {
  constexpr std::size_t kEs = elem_bytes<D>();
  typename V::F acc[RB][DC];
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    const auto a = V::set1(alpha[r]);
    KVTIER_UNROLL for (int c = 0; c < DC; ++c) {
      acc[r][c] = V::mul(V::load(o + r * dim + d + c * V::kWidth), a);
    }
  }
  for (uint32_t t = 0; t < tokens; ++t) {
    typename V::F vv[DC];
    if constexpr (split_kv<V, D>() && DC % 2 == 0) {
      KVTIER_UNROLL for (int c = 0; c < DC; c += 2) {
        load_kv_split<V, D, kNanCodes>(v[t] + (d + c * V::kWidth) * kEs, vv[c], vv[c + 1]);
      }
    } else {
      KVTIER_UNROLL for (int c = 0; c < DC; ++c) {
        vv[c] = load_kv<V, D, kNanCodes>(v[t] + (d + c * V::kWidth) * kEs);
      }
    }
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      const auto w = V::set1(p[r * kTileTokens + t]);
      KVTIER_UNROLL for (int c = 0; c < DC; ++c) acc[r][c] = V::fmadd(w, vv[c], acc[r][c]);
    }
  }
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    KVTIER_UNROLL for (int c = 0; c < DC; ++c) V::store(o + r * dim + d + c * V::kWidth, acc[r][c]);
  }
}

template <class V, Dtype D, int RB, bool kNanCodes>
KVTIER_ALWAYS_INLINE void accumulate_rows(const float* p, const float* alpha,
                                          const uint8_t* const* v, uint32_t tokens, uint32_t dim,
                                          float* o, TilePrefetch& pf) {
  // split_kv (bf16_split, fp8_split): 4 x 4 accumulators for 4 rows too (21 of AVX-512's
  // registers), so each chunk's setup (o loaded, rescaled, stored) is paid over twice the dims
  // and 16 FMA chains hide the FMA latency where 8 only just did. Measured as bf16_split's:
  // 13.3 -> 14.5 GiB/s in L3.
  constexpr uint32_t kDc = RB >= 4 && !wide_pv_blocks<V, D>() ? 2 : 4;
  uint32_t d = 0;
  for (; d + kDc * V::kWidth <= dim; d += kDc * V::kWidth) {
    pf.issue();
    accumulate_chunk<V, D, RB, kDc, kNanCodes>(p, alpha, v, tokens, dim, d, o);
  }
  if constexpr (split_kv<V, D>()) {  // whole split chunks in split order (calls_rb* counts)
    for (; d + 2 * V::kWidth <= dim; d += 2 * V::kWidth) {
      pf.issue();
      accumulate_chunk<V, D, RB, 2, kNanCodes>(p, alpha, v, tokens, dim, d, o);
    }
  }
  for (; d < dim; d += V::kWidth) {
    pf.issue();
    accumulate_chunk<V, D, RB, 1, kNanCodes>(p, alpha, v, tokens, dim, d, o);
  }
}

// Tokens of a tile that row r of a head sees: a prefix of the tile (the causal mask), the same
// for the rows of one query token (r / group) and non-decreasing in r. In decode every row sees
// the whole tile.
struct TileVisibility {
  const uint32_t* visible_end;  // per query token
  uint32_t group;
  uint32_t tile_begin;  // KV position of the tile's first token
  uint32_t tokens;      // tokens in the tile

  uint32_t of_row(uint32_t r) const {
    const uint32_t end = visible_end[r / group];
    return end <= tile_begin ? 0 : (end - tile_begin < tokens ? end - tile_begin : tokens);
  }
  // Whether every row sees every token of the tile (row 0 sees the fewest).
  bool whole() const { return of_row(0) == tokens; }
};

struct TileRows {
  const float* q;          // [rows][dim]
  const uint16_t* q_bf16;  // [rows][dim] bf16; the bf16-dot path only
  uint32_t rows;
  uint32_t group;               // row r belongs to query token r / group
  const uint32_t* visible_end;  // per query token
  uint32_t tile_begin;          // KV position of the tile's first token
  const float* k_scale;         // [kTileTokens] per-token (per-page) scales; fp8 only
  const float* v_scale;
  // fp8 on the dot path only: 1 / v_scale, 0 where that is not finite, and 1 exactly there.
  const float* v_scale_inverse;
  const float* v_scale_unusable;
  float* m;
  float* l;
  float* o;       // [rows][dim]
  float* scores;  // [rows][kTileTokens]
  float* alpha;   // [rows]
};

// Stores the weights p of tokens [t, t + kWidth) of the row whose scores start at s, as the V sum
// reads them, and returns what l sums for them:
// - the fp32 paths: p, times the per-page V scale for fp8 (p * (v * s) == (p * s) * v); l sums p;
// - kPairs (the dot path): p rounded to bf16, packed in pairs at the start of the row (chunk t's
//   land in bytes [2t, 2t + 2 kWidth), below every chunk not yet read); l sums the rounded values,
//   for fp8 with the V scale rounded in and divided out again (v_scale_inverse), or the weight
//   itself where the scale has no finite inverse (its V terms are 0 or negligible).
template <class V, Dtype D, bool kPairs>
KVTIER_ALWAYS_INLINE typename V::F store_weights(float* s, uint32_t t, typename V::F p,
                                                 const float* v_scale, const float* v_scale_inverse,
                                                 const float* v_scale_unusable) {
  constexpr bool kScaled = D == Dtype::kFP8E4M3;
  if constexpr (kPairs) {
    uint16_t* pairs = reinterpret_cast<uint16_t*>(s) + t;
    if constexpr (kScaled) {
      const auto rounded = V::store_bf16_rne_widen(pairs, V::mul(p, V::load(v_scale + t)));
      return V::fmadd(rounded, V::load(v_scale_inverse + t),
                      V::mul(p, V::load(v_scale_unusable + t)));
    } else {
      return V::store_bf16_rne_widen(pairs, p);
    }
  } else {
    V::store(s + t, kScaled ? V::mul(p, V::load(v_scale + t)) : p);
    return p;
  }
}

// The online-softmax step of every row of a tile: scores become weights in place, m and l are
// updated and alpha (the rescale of the row's o) is set. kPairs (the bf16-dot path) stores each
// row's weights rounded to bf16, packed in pairs at the start of its scores, and sums the rounded
// values into l, so the normalisation matches exactly what o accumulates.
template <class V, Dtype D, bool kPairs>
void softmax_rows(const TileRows& a, uint32_t tokens) {
  constexpr float kNegInf = -__builtin_inff();
  constexpr bool kScaled = D == Dtype::kFP8E4M3;
  const TileVisibility vis{a.visible_end, a.group, a.tile_begin, tokens};
  for (uint32_t r = 0; r < a.rows; ++r) {
    float* s = a.scores + r * kTileTokens;
    const uint32_t visible = vis.of_row(r);
    if (visible == 0) {
      for (uint32_t t = 0; t < kTileTokens; ++t) s[t] = 0.0f;
      a.alpha[r] = 1.0f;
      continue;
    }
    if constexpr (kScaled) {
      // Per-page K scale: q . (k * s) == (q . k) * s. Before the mask: -inf * s is NaN for a
      // zero scale (an all-zero page), and a masked score must stay -inf whatever its page.
      for (uint32_t t = 0; t < kTileTokens; t += V::kWidth) {
        V::store(s + t, V::mul(V::load(s + t), V::load(a.k_scale + t)));
      }
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
      sum = V::add(sum, store_weights<V, D, kPairs>(s, t, p, a.v_scale, a.v_scale_inverse,
                                                    a.v_scale_unusable));
    }
    a.l[r] = a.l[r] * alpha + V::reduce_add(sum);
    a.m[r] = m_new;
    a.alpha[r] = alpha;
  }
}

// softmax_rows for a tile every row sees whole (all of decode) on lane types with kTileTokens
// lanes and 16-vector transposing reductions (vec_avx512.inl): 16 rows at a time, of every head
// at once (the scores of a tile are [heads][rows][kTileTokens], one contiguous run of rows).
// The rows' maxima come out of one max tree as one vector, so m, alpha (one exp2 for 16 rows)
// and l are updated lane-wise, and the rows' sums out of one add tree: about 26 instructions a
// row where softmax_rows takes about 60 (two horizontal reductions and a whole-vector exp2 for
// its one alpha). Same semantics: scale before the -inf past the tile's end, m_new = max(m,
// tile max) with the tile's max winning a NaN, weights times the V scale. Measured as
// bf16_split's: 14.2 -> 15.2 GiB/s in L3 (the old softmax took 12 % of the kernel's samples).
// Weights are stored and summed by store_weights, as in softmax_rows.
template <class V>
constexpr bool has_wide_softmax() {
  return V::kWidth == static_cast<int>(kTileTokens) && requires(const typename V::F(&x)[16]) {
    V::reduce_add16(x);
    V::reduce_max16(x);
  };
}

template <class V, Dtype D, bool kPairs>
void softmax_rows_wide(float* scores, float* m, float* l, float* alpha, uint32_t all_rows,
                       uint32_t tokens, const float* k_scale, const float* v_scale,
                       const float* v_scale_inverse, const float* v_scale_unusable) {
  constexpr bool kScaled = D == Dtype::kFP8E4M3;
  constexpr float kNegInf = -__builtin_inff();
  using F = typename V::F;
  for (uint32_t g = 0; g < all_rows; g += kTileTokens) {
    const uint32_t n = all_rows - g < kTileTokens ? all_rows - g : kTileTokens;
    float* s = scores + static_cast<std::size_t>(g) * kTileTokens;
    F x[16];
    KVTIER_UNROLL for (uint32_t i = 0; i < kTileTokens; ++i) {
      if (i >= n) {
        x[i] = V::zero();  // a lane no row owns; its results are dropped
        continue;
      }
      float* row = s + i * kTileTokens;
      if constexpr (kScaled) V::store(row, V::mul(V::load(row), V::load(k_scale)));
      for (uint32_t t = tokens; t < kTileTokens; ++t) row[t] = kNegInf;
      x[i] = V::load(row);
    }
    alignas(64) float m_old[kTileTokens] = {};
    alignas(64) float l_old[kTileTokens] = {};
    alignas(64) float m_new[kTileTokens];
    for (uint32_t i = 0; i < n; ++i) {
      m_old[i] = m[g + i];
      l_old[i] = l[g + i];
    }
    const F mo = V::load(m_old);
    const F mn = V::max(mo, V::reduce_max16(x));
    const F al = V::exp2(V::sub(mo, mn));
    V::store(m_new, mn);
    KVTIER_UNROLL for (uint32_t i = 0; i < kTileTokens; ++i) {
      x[i] = V::exp2(V::sub(x[i], V::set1(m_new[i])));
      if (i >= n) continue;
      x[i] = store_weights<V, D, kPairs>(s + i * kTileTokens, 0, x[i], v_scale, v_scale_inverse,
                                         v_scale_unusable);
    }
    alignas(64) float l_new[kTileTokens];
    alignas(64) float al_new[kTileTokens];
    V::store(l_new, V::add(V::mul(V::load(l_old), al), V::reduce_add16(x)));
    V::store(al_new, al);
    for (uint32_t i = 0; i < n; ++i) {
      m[g + i] = m_new[i];
      l[g + i] = l_new[i];
      alpha[g + i] = al_new[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 and fp8 KV with vdpbf16ps (dot_kv: lane types with kBf16Dot / kFp8Dot). Same tiles,
// register blocks, softmax and prefetching as above; what changes is the arithmetic:
// - scores: q rows rounded to bf16 once per item (ItemArgs::q_bf16), then 32 products per
//   instruction against K rows read straight from the page (bf16 pairs along head_dim are K's
//   memory layout), nothing widened; fp8 rows are widened to bf16 exactly (load_fp8_pairs), and
//   their page scales applied to the scores and weights as on the fp32 path;
// - P.V: the rows of two consecutive tokens interleaved (vpunpcklwd/hwd within 128-bit lanes) so
//   a 32-bit lane holds (v_t[d], v_t+1[d]), times the weights (p_t, p_t+1) rounded to bf16 and
//   broadcast as one pair. The accumulators then hold d in interleave()'s order; o is kept in
//   that order for the whole item (full 32-element chunks; a 16-element tail is interleaved in
//   natural order instead) and put back at the item's end, so loads and stores of o stay plain.
//   An odd token count pairs the last token with a zero row and a zero weight.
// - fp8's per-page V scale goes into the weight before it is rounded; l then sums each rounded
//   weight divided by its scale (one more f32 rounding), so o / l is still an average under
//   weights perturbed by a factor within 2^-8 of 1, as for bf16 (softmax_rows).
// fp8 on this path, measured on a 2-vCPU Zen 4 VM (8 KV heads x 128, GQA 4, 32 x 4096 tokens,
// two threads; medians of 5 runs, old and new builds alternating, machine shared): decode 0.49
// -> 0.54 of the streaming read (12.9 -> 14.0 GiB/s), chunked prefill 124 -> 132 GFLOP/s. Less
// than the halved multiply-adds promise: per token, fp8 and bf16 now take about the same time
// (in L3, 8 against 18 GiB/s, i.e. 8 and 9 G values/s), so what bounds both is the per-token
// work outside the products (score sums, softmax, o loads and stores), not the KV arithmetic.
// Tried: forcing reduce_add4x4 inline (GCC calls it out of line here, 9 % of the samples in
// cache): no gain measurable over the noise. What did help: the 16-row softmax of the fp32 path
// (softmax_rows_wide with kPairs) on this path too, same VM, old and new builds alternating: fp8
// decode on one thread 0.42 -> 0.48 of the streaming read (medians of 7), bf16 unchanged (0.70 /
// 0.69); chunked prefill bf16 143 -> 186 and fp8 114 -> 134 GFLOP/s (medians of 3).
// ---------------------------------------------------------------------------------------------

// 32 elements of a KV row from element d, as bf16 pairs: bf16 as stored, fp8 widened exactly.
template <class V, Dtype D>
KVTIER_ALWAYS_INLINE typename V::Pairs load_dot(const uint8_t* row, uint32_t d) {
  if constexpr (D == Dtype::kFP8E4M3) {
    return V::load_fp8_pairs(row + d);
  } else {
    return V::load_pairs(row + 2 * d);
  }
}

// 16 elements from element d in the low half, zeros above.
template <class V, Dtype D>
KVTIER_ALWAYS_INLINE typename V::Pairs load_dot_half(const uint8_t* row, uint32_t d) {
  if constexpr (D == Dtype::kFP8E4M3) {
    return V::load_fp8_pairs_half(row + d);
  } else {
    return V::load_pairs_half(row + 2 * d);
  }
}

// scores[r][t] = q_r . k_t for an RB x TB block: q rows are bf16, `dim` apart.
template <class V, Dtype D, int RB, int TB>
inline void score_block_dot(const uint16_t* q, const uint8_t* const* k, uint32_t dim,
                            float* scores) {
  typename V::F acc[RB][TB];
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::zero();
  }
  uint32_t d = 0;
  for (; d + 32 <= dim; d += 32) {
    typename V::Pairs kv[TB];
    KVTIER_UNROLL for (int t = 0; t < TB; ++t) kv[t] = load_dot<V, D>(k[t], d);
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      const auto qv = V::load_pairs(q + r * dim + d);
      KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::dot(acc[r][t], qv, kv[t]);
    }
  }
  if (d < dim) {  // 16 left: the upper halves are zero in both operands
    typename V::Pairs kv[TB];
    KVTIER_UNROLL for (int t = 0; t < TB; ++t) kv[t] = load_dot_half<V, D>(k[t], d);
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      const auto qv = V::load_pairs_half(q + r * dim + d);
      KVTIER_UNROLL for (int t = 0; t < TB; ++t) acc[r][t] = V::dot(acc[r][t], qv, kv[t]);
    }
  }
  store_scores<V, RB, TB>(acc, scores);
}

// o_r = o_r * alpha_r + sum_t p[r][t] * v_t over DC chunks of 32 dims from d, o in pair order.
// p rows hold the bf16 weights in pairs (softmax_rows<..., true>); v has an even number of rows.
template <class V, Dtype D, int RB, int DC>
KVTIER_ALWAYS_INLINE void accumulate_chunk_dot(const float* p, const float* alpha,
                                               const uint8_t* const* v, uint32_t pairs,
                                               uint32_t dim, uint32_t d, float* o) {
  typename V::F acc[RB][2 * DC];
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    const auto a = V::set1(alpha[r]);
    KVTIER_UNROLL for (int c = 0; c < 2 * DC; ++c) {
      acc[r][c] = V::mul(V::load(o + r * dim + d + c * 16), a);
    }
  }
  for (uint32_t j = 0; j < pairs; ++j) {
    typename V::Pairs lo[DC], hi[DC];
    KVTIER_UNROLL for (int c = 0; c < DC; ++c) {
      const uint32_t e = d + 32 * c;
      V::interleave(load_dot<V, D>(v[2 * j], e), load_dot<V, D>(v[2 * j + 1], e), lo[c], hi[c]);
    }
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      const auto w = V::broadcast_pair(p + r * kTileTokens + j);
      KVTIER_UNROLL for (int c = 0; c < DC; ++c) {
        acc[r][2 * c] = V::dot(acc[r][2 * c], lo[c], w);
        acc[r][2 * c + 1] = V::dot(acc[r][2 * c + 1], hi[c], w);
      }
    }
  }
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    KVTIER_UNROLL for (int c = 0; c < 2 * DC; ++c) V::store(o + r * dim + d + c * 16, acc[r][c]);
  }
}

// The last 16 dims of a head_dim that is an odd multiple of 16, in natural order.
template <class V, Dtype D, int RB>
KVTIER_ALWAYS_INLINE void accumulate_half_dot(const float* p, const float* alpha,
                                              const uint8_t* const* v, uint32_t pairs, uint32_t dim,
                                              uint32_t d, float* o) {
  typename V::F acc[RB];
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
    acc[r] = V::mul(V::load(o + r * dim + d), V::set1(alpha[r]));
  }
  for (uint32_t j = 0; j < pairs; ++j) {
    const auto x = V::interleave_low_halves(load_dot_half<V, D>(v[2 * j], d),
                                            load_dot_half<V, D>(v[2 * j + 1], d));
    KVTIER_UNROLL for (int r = 0; r < RB; ++r) {
      acc[r] = V::dot(acc[r], x, V::broadcast_pair(p + r * kTileTokens + j));
    }
  }
  KVTIER_UNROLL for (int r = 0; r < RB; ++r) V::store(o + r * dim + d, acc[r]);
}

template <class V, Dtype D, int RB>
KVTIER_ALWAYS_INLINE void accumulate_rows_dot(const float* p, const float* alpha,
                                              const uint8_t* const* v, uint32_t tokens,
                                              uint32_t dim, float* o, TilePrefetch& pf) {
  constexpr uint32_t kDc = RB >= 4 ? 2 : 4;
  const uint32_t pairs = (tokens + 1) / 2;
  uint32_t d = 0;
  for (; d + 32 * kDc <= dim; d += 32 * kDc) {
    pf.issue();
    accumulate_chunk_dot<V, D, RB, kDc>(p, alpha, v, pairs, dim, d, o);
  }
  for (; d + 32 <= dim; d += 32) {
    pf.issue();
    accumulate_chunk_dot<V, D, RB, 1>(p, alpha, v, pairs, dim, d, o);
  }
  if (d < dim) accumulate_half_dot<V, D, RB>(p, alpha, v, pairs, dim, d, o);
}

// The partner of an odd last token, and of tokens a row must not see, in the bf16 pair products.
alignas(64) constexpr uint8_t kZeroBf16Row[2 * kMaxHeadDim] = {};

// accumulate_head_masked for the bf16-dot path. Tokens go in pairs, so a pair that straddles a
// row's visible end takes the zero row for its masked half: the block pass covers the first
// row's tokens with v_rows[common] (if common is odd) replaced by the zero row, and each later
// row's remainder starts at the pair holding token `common`, with the zero row for the tokens the
// block pass already added and for the partner past its own end. v_rows has kTileTokens + 1
// entries, v_rows[tokens] the zero row.
template <class V, Dtype D>
[[gnu::noinline]] void accumulate_head_dot_masked(const float* p, const float* alpha,
                                                  const uint8_t** v_rows, uint32_t rows,
                                                  const TileVisibility& vis, uint32_t dim, float* o,
                                                  TilePrefetch& pf) {
  static constexpr float kOne = 1.0f;
  uint32_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const uint32_t common = vis.of_row(r);
    const uint8_t* partner = v_rows[common];
    if (common % 2 != 0) v_rows[common] = kZeroBf16Row;
    accumulate_rows_dot<V, D, 4>(p + r * kTileTokens, alpha + r, v_rows, common, dim, o + r * dim,
                                 pf);
    v_rows[common] = partner;
    const uint32_t first = common & ~1u;
    for (uint32_t rr = r + 1; rr < r + 4; ++rr) {
      const uint32_t end = vis.of_row(rr);
      if (end <= common) continue;
      const uint8_t* rest[kTileTokens];
      const uint32_t n = end - first;
      for (uint32_t t = first; t < first + (n + 1) / 2 * 2; ++t) {
        rest[t - first] = t >= common && t < end ? v_rows[t] : kZeroBf16Row;
      }
      TilePrefetch none;
      accumulate_rows_dot<V, D, 1>(p + rr * kTileTokens + first / 2, &kOne, rest, n, dim,
                                   o + rr * dim, none);
    }
  }
  for (; r < rows; ++r) {
    const uint32_t end = vis.of_row(r);
    const uint8_t* partner = v_rows[end];
    if (end % 2 != 0) v_rows[end] = kZeroBf16Row;
    accumulate_rows_dot<V, D, 1>(p + r * kTileTokens, alpha + r, v_rows, end, dim, o + r * dim, pf);
    v_rows[end] = partner;
  }
}

// Row addresses (K; V is v_offset further) and per-page scales of the tokens of one tile.
struct TileAddresses {
  const uint8_t* row[kTileTokens];
  alignas(64) float k_scale[kTileTokens];
  alignas(64) float v_scale[kTileTokens];
  // With `inverses` only (fp8 on the dot path, see TileRows).
  alignas(64) float v_scale_inverse[kTileTokens];
  alignas(64) float v_scale_unusable[kTileTokens];
  uint32_t tokens;
};

// The scales are the pages' (1 without a.scales) times `scale_factor` (kv_scale_factor).
inline void locate_tile(const ItemArgs& a, std::size_t token_bytes, uint32_t begin,
                        float scale_factor, bool inverses, TileAddresses& t) {
  t.tokens = a.kv_end - begin < kTileTokens ? a.kv_end - begin : kTileTokens;
  for (uint32_t j = 0; j < kTileTokens; ++j) {
    t.k_scale[j] = scale_factor;
    t.v_scale[j] = scale_factor;
  }
  for (uint32_t j = 0; j < t.tokens; ++j) {
    const uint32_t pos = begin + j;
    const uint32_t page = pos / a.page_tokens;
    const uint32_t frame = a.pages[page];
    t.row[j] = a.arena + frame * a.frame_stride + (pos - page * a.page_tokens) * token_bytes;
    if (a.scales != nullptr) {
      t.k_scale[j] = a.scales[2 * static_cast<std::size_t>(frame)] * scale_factor;
      t.v_scale[j] = a.scales[2 * static_cast<std::size_t>(frame) + 1] * scale_factor;
    }
  }
  if (!inverses) return;
  for (uint32_t j = 0; j < kTileTokens; ++j) {
    const float inverse = 1.0f / t.v_scale[j];
    const bool usable = __builtin_isfinite(inverse);
    t.v_scale_inverse[j] = usable ? inverse : 0.0f;
    t.v_scale_unusable[j] = usable ? 0.0f : 1.0f;
  }
}

// scores[r][t..t+TB) = q_r . k for every row r of one head, in register blocks of 4 rows.
template <class V, Dtype D, bool kDot, int TB, bool kNanCodes = true>
inline void score_head(const float* q, const uint16_t* q_bf16, uint32_t rows,
                       const uint8_t* const* k, uint32_t dim, float* scores) {
  uint32_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    if constexpr (kDot) {
      score_block_dot<V, D, 4, TB>(q_bf16 + r * dim, k, dim, scores + r * kTileTokens);
    } else {
      score_block<V, D, 4, TB, kNanCodes>(q + r * dim, k, dim, scores + r * kTileTokens);
    }
  }
  for (; r < rows; ++r) {
    if constexpr (kDot) {
      score_block_dot<V, D, 1, TB>(q_bf16 + r * dim, k, dim, scores + r * kTileTokens);
    } else {
      score_block<V, D, 1, TB, kNanCodes>(q + r * dim, k, dim, scores + r * kTileTokens);
    }
  }
}

// o_r = o_r * alpha_r + sum_t p[r][t] * v_t for every row of one head, in blocks of 4 rows.
template <class V, Dtype D, bool kNanCodes>
inline void accumulate_head(const float* p, const float* alpha, const uint8_t* const* v,
                            uint32_t rows, uint32_t tokens, uint32_t dim, float* o,
                            TilePrefetch& pf) {
  uint32_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    accumulate_rows<V, D, 4, kNanCodes>(p + r * kTileTokens, alpha + r, v, tokens, dim,
                                        o + r * dim, pf);
  }
  for (; r < rows; ++r) {
    accumulate_rows<V, D, 1, kNanCodes>(p + r * kTileTokens, alpha + r, v, tokens, dim,
                                        o + r * dim, pf);
  }
}

// accumulate_head for a tile the causal mask cuts (in prefill, one holding some row's last
// visible token): each row adds only the tokens it sees. Masked tokens are left out rather than
// weighted by 0, since 0 * v is NaN when a token the row must not see holds inf or NaN. A block
// runs over the tokens its first row sees (the fewest); each later row then adds the rest of its
// own, alone, with alpha 1 (o * 1 is exact, so every element is the same sum in the same order as
// in the unmasked loop, less the zero terms) and without prefetching (the tile's prefetch plan
// counts the block passes only). Out of line: the unmasked loop, all of decode, stays as it was.
template <class V, Dtype D, bool kNanCodes>
[[gnu::noinline]] void accumulate_head_masked(const float* p, const float* alpha,
                                              const uint8_t* const* v, uint32_t rows,
                                              const TileVisibility& vis, uint32_t dim, float* o,
                                              TilePrefetch& pf) {
  static constexpr float kOne = 1.0f;
  uint32_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const uint32_t common = vis.of_row(r);
    accumulate_rows<V, D, 4, kNanCodes>(p + r * kTileTokens, alpha + r, v, common, dim, o + r * dim,
                                        pf);
    for (uint32_t rr = r + 1; rr < r + 4; ++rr) {
      const uint32_t end = vis.of_row(rr);
      if (end <= common) continue;
      TilePrefetch none;
      accumulate_rows<V, D, 1, kNanCodes>(p + rr * kTileTokens + common, &kOne, v + common,
                                          end - common, dim, o + rr * dim, none);
    }
  }
  for (; r < rows; ++r) {
    accumulate_rows<V, D, 1, kNanCodes>(p + r * kTileTokens, alpha + r, v, vis.of_row(r), dim,
                                        o + r * dim, pf);
  }
}

// Whether any of `count` rows of `bytes` each, `offset` past rows[i], holds an fp8 NaN code.
template <class V>
inline bool rows_have_fp8_nan(const uint8_t* const* rows, uint32_t count, std::size_t offset,
                              std::size_t bytes) {
  for (uint32_t i = 0; i < count; ++i) {
    if (V::has_fp8_nan(rows[i] + offset, bytes)) return true;
  }
  return false;
}

template <class V, Dtype D>
void attend_item_t(const ItemArgs& a) {
  constexpr bool kDot = dot_kv<V, D>();
  constexpr bool kScanNan = scans_fp8_nan<V, D>();
  constexpr std::size_t kEs = elem_bytes<D>();
  const uint32_t dim = a.head_dim;
  const uint32_t heads = a.kv_heads;
  const uint32_t rows = a.q_tokens * a.group;
  const std::size_t head_bytes = static_cast<std::size_t>(dim) * kEs;
  const std::size_t token_bytes = head_bytes * heads;
  const std::size_t v_offset = token_bytes * a.page_tokens;
  const std::size_t all_rows = static_cast<std::size_t>(heads) * rows;
  float* scores = a.work;  // [heads][rows][kTileTokens]
  float* alpha = scores + all_rows * kTileTokens;
  // pf.issue() calls a full tile makes: one per 4 tokens and head while scoring, and one per
  // chunk of V dims per row block and head (accumulate_rows / accumulate_rows_dot).
  const uint32_t chunk = kDot ? 32 : V::kWidth;
  constexpr bool kSplit = split_kv<V, D>();
  // Chunks of 4 x chunk dims, then (split order) whole split chunks of 2, then single ones.
  const uint32_t rest = dim % (4 * chunk);
  const uint32_t calls_4_2_1 = dim / (4 * chunk) + rest / (2 * chunk) + rest % (2 * chunk) / chunk;
  const uint32_t calls_rb4 =
      wide_pv_blocks<V, D>() ? calls_4_2_1 : dim / (2 * chunk) + dim % (2 * chunk) / chunk;
  const uint32_t calls_rb1 = kSplit ? calls_4_2_1 : dim / (4 * chunk) + rest / chunk;
  const uint32_t pf_calls = heads * (kTileTokens / 4 + rows / 4 * calls_rb4 + rows % 4 * calls_rb1);

  if (a.kv_begin >= a.kv_end) return;
  if constexpr (kSplit) {
    for (std::size_t i = 0; i < all_rows; ++i) {
      for (uint32_t d = 0; d + 2 * V::kWidth <= dim; d += 2 * V::kWidth) {
        V::to_split_order(a.q + i * dim + d);
        V::to_split_order(a.o + i * dim + d);
      }
    }
  }
  if constexpr (kDot) {
    for (std::size_t i = 0; i < all_rows * dim; i += V::kWidth) {
      V::store_bf16_rne(a.q_bf16 + i, V::load(a.q + i));
    }
    for (std::size_t i = 0; i < all_rows; ++i) {
      for (uint32_t d = 0; d + 32 <= dim; d += 32) V::to_pair_order(a.o + i * dim + d);
    }
  }
  TileAddresses tiles[2];
  int cur = 0;
  constexpr float kScaleFactor = kv_scale_factor<V, D>();
  constexpr bool kInverses = kDot && D == Dtype::kFP8E4M3;
  locate_tile(a, token_bytes, a.kv_begin, kScaleFactor, kInverses, tiles[cur]);
  for (uint32_t begin = a.kv_begin; begin < a.kv_end; begin += kTileTokens, cur ^= 1) {
    const TileAddresses& tile = tiles[cur];
    const uint32_t tokens = tile.tokens;
    TilePrefetch pf;
    if (begin + kTileTokens < a.kv_end) {
      TileAddresses& next = tiles[cur ^ 1];
      locate_tile(a, token_bytes, begin + kTileTokens, kScaleFactor, kInverses, next);
      pf = TilePrefetch(next.row, next.tokens, token_bytes, v_offset, pf_calls);
    }
    // K in address order: 4 tokens (four consecutive rows of a page) at a time, every head of
    // them before the next 4. Each score is the same sum in the same order as head by head.
    uint32_t t = 0;
    for (; t + 4 <= tokens; t += 4) {
      [[maybe_unused]] bool k_clean = false;
      if constexpr (kScanNan) k_clean = !rows_have_fp8_nan<V>(tile.row + t, 4, 0, token_bytes);
      for (uint32_t h = 0; h < heads; ++h) {
        pf.issue();
        const std::size_t off = h * head_bytes;
        const uint8_t* k[4] = {tile.row[t] + off, tile.row[t + 1] + off, tile.row[t + 2] + off,
                               tile.row[t + 3] + off};
        const std::size_t row0 = static_cast<std::size_t>(h) * rows;
        const float* q = a.q + row0 * dim;
        const uint16_t* q_bf16 = kDot ? a.q_bf16 + row0 * dim : nullptr;
        float* s = scores + row0 * kTileTokens + t;
        if constexpr (kScanNan) {
          if (k_clean) {
            score_head<V, D, kDot, 4, false>(q, q_bf16, rows, k, dim, s);
            continue;
          }
        }
        score_head<V, D, kDot, 4>(q, q_bf16, rows, k, dim, s);
      }
    }
    for (; t < tokens; ++t) {
      for (uint32_t h = 0; h < heads; ++h) {
        const uint8_t* k[1] = {tile.row[t] + h * head_bytes};
        const std::size_t row0 = static_cast<std::size_t>(h) * rows;
        score_head<V, D, kDot, 1>(a.q + row0 * dim, kDot ? a.q_bf16 + row0 * dim : nullptr, rows, k,
                                  dim, scores + row0 * kTileTokens + t);
      }
    }
    const TileVisibility vis{a.visible_end, a.group, begin, tokens};
    const bool masked = !vis.whole();
    // The online softmax: every head's rows at once where the lane type can and the tile is
    // whole, else head by head.
    bool softmax_done = false;
    if constexpr (has_wide_softmax<V>()) {
      if (!masked) {
        softmax_rows_wide<V, D, kDot>(scores, a.m, a.l, alpha, static_cast<uint32_t>(all_rows),
                                      tokens, tile.k_scale, tile.v_scale, tile.v_scale_inverse,
                                      tile.v_scale_unusable);
        softmax_done = true;
      }
    }
    for (uint32_t h = 0; h < heads && !softmax_done; ++h) {
      const std::size_t row0 = static_cast<std::size_t>(h) * rows;
      const TileRows tr{a.q + row0 * dim,
                        nullptr,
                        rows,
                        a.group,
                        a.visible_end,
                        begin,
                        tile.k_scale,
                        tile.v_scale,
                        tile.v_scale_inverse,
                        tile.v_scale_unusable,
                        a.m + row0,
                        a.l + row0,
                        a.o + row0 * dim,
                        scores + row0 * kTileTokens,
                        alpha + row0};
      softmax_rows<V, D, kDot>(tr, tokens);
    }
    // P.V head by head over the whole tile. Rejected: 4 tokens at a time, every head of them
    // (address order for V too): o is then loaded and stored four times per tile, which costs
    // more than the order saves (0.56 against 0.60 of a streaming read, avx512_bf16).
    // Each row adds only the tokens it sees: tiles the mask cuts take the *_masked forms; decode
    // and the tiles below every row's visible end the unmasked loops (one check per tile).
    [[maybe_unused]] bool v_clean = false;
    if constexpr (kScanNan) {
      v_clean = !rows_have_fp8_nan<V>(tile.row, tokens, v_offset, token_bytes);
    }
    for (uint32_t h = 0; h < heads; ++h) {
      const std::size_t row0 = static_cast<std::size_t>(h) * rows;
      const float* p = scores + row0 * kTileTokens;
      const float* al = alpha + row0;
      float* o = a.o + row0 * dim;
      // One more than a tile: v_rows[tokens] is the zero partner of an odd last token in the
      // bf16 pair products (an odd count is always below kTileTokens).
      const uint8_t* v_rows[kTileTokens + 1];
      for (uint32_t j = 0; j < tokens; ++j) v_rows[j] = tile.row[j] + v_offset + h * head_bytes;
      if constexpr (kDot) {
        v_rows[tokens] = kZeroBf16Row;
        if (masked) {
          accumulate_head_dot_masked<V, D>(p, al, v_rows, rows, vis, dim, o, pf);
          continue;
        }
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4) {
          accumulate_rows_dot<V, D, 4>(p + r * kTileTokens, al + r, v_rows, tokens, dim,
                                       o + r * dim, pf);
        }
        for (; r < rows; ++r) {
          accumulate_rows_dot<V, D, 1>(p + r * kTileTokens, al + r, v_rows, tokens, dim,
                                       o + r * dim, pf);
        }
      } else {
        if constexpr (kScanNan) {
          if (v_clean) {
            if (masked) {
              accumulate_head_masked<V, D, false>(p, al, v_rows, rows, vis, dim, o, pf);
            } else {
              accumulate_head<V, D, false>(p, al, v_rows, rows, tokens, dim, o, pf);
            }
            continue;
          }
        }
        if (masked) {
          accumulate_head_masked<V, D, true>(p, al, v_rows, rows, vis, dim, o, pf);
        } else {
          accumulate_head<V, D, true>(p, al, v_rows, rows, tokens, dim, o, pf);
        }
      }
    }
    pf.drain();
  }
  if constexpr (kDot) {
    for (std::size_t i = 0; i < all_rows; ++i) {
      for (uint32_t d = 0; d + 32 <= dim; d += 32) V::from_pair_order(a.o + i * dim + d);
    }
  }
  if constexpr (kSplit) {
    for (std::size_t i = 0; i < all_rows; ++i) {
      for (uint32_t d = 0; d + 2 * V::kWidth <= dim; d += 2 * V::kWidth) {
        V::from_split_order(a.o + i * dim + d);
      }
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
  return IsaKernels{.isa = isa,
                    .name = name,
                    .convert = &convert<V>,
                    .to_f32 = &to_f32<V>,
                    .from_f32 = &from_f32<V>,
                    .abs_max = &abs_max<V>,
                    .attend_item = &attend_item<V>,
                    .stream_read = &V::stream_read};
}

#undef KVTIER_UNROLL
#undef KVTIER_ALWAYS_INLINE
