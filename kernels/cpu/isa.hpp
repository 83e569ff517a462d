// Run-time choice of the CPU instruction set, and the table of SIMD kernels each choice provides.
//
// Four implementations of the same template code (isa_core.inl) are compiled from separate files
// with their own flags: scalar (plain x86-64 or any other target), AVX2+FMA+F16C, AVX-512
// (F/BW/VL/DQ), and AVX-512 plus AVX512_BF16 and AVX512_VBMI. best_isa() picks the widest exact one
// the CPU and OS support (up to avx512), once; KVTIER_CPU_ISA=scalar|avx2|avx512 caps it (for
// comparisons), KVTIER_CPU_ISA=avx512_bf16 opts into the fourth, and callers may ask for a given
// one (tests run all).
//
// The first three compute attention in fp32 from exact inputs. avx512_bf16 differs for bf16 and
// fp8 KV only: it rounds q and the softmax weights to bf16 and multiplies with vdpbf16ps (fp32
// accumulation), as GPU attention kernels do, fp8 widened to bf16 exactly by VBMI byte tables;
// isa_core.inl states the error this adds. It is not
// the default: the CPU kernels are the reference the CUDA kernels and engines are checked
// against, and it speeds up prefill (1.37x) and in-cache decode, decode from memory only a little
// (0.606 vs 0.579 of a streaming read on one core).
//
// Why per-file flags and a function table rather than target attributes or -march=native: the
// library must run on any x86-64, and a file compiled with AVX-512 flags must never lend an inline
// function to the rest of the program. So the ISA files include only this header and intrinsics,
// put everything in an anonymous namespace and export one table getter. This header must therefore
// stay declarations and plain data only (no inline functions that those files could emit).
//
// The tables are immutable and shared by all threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/types.hpp"

namespace kvtier::kernels::cpu {

enum class Isa : uint8_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kAvx512Bf16 = 4 };

// Tokens per attention tile: K/V of a tile are widened to f32 once and used by every query row.
inline constexpr uint32_t kTileTokens = 16;

// The largest head_dim the kernels take (kernels/paged_kv.cpp rejects larger ones).
inline constexpr uint32_t kMaxHeadDim = 256;

// One work item of paged attention: a token range of one sequence, all KV heads, a block of query
// tokens. The state (m, l, o) is per row, rows of a head are (query token i, group member g) at
// i * group + g. Scores are in log2 units: q is pre-multiplied by sm_scale * log2(e).
struct ItemArgs {
  const uint8_t* arena;   // frame f at arena + f * frame_stride
  uint64_t frame_stride;  // bytes
  Dtype dtype;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t page_tokens;
  const float* scales;          // fp8 only, [num_frames][2]; nullptr = 1.0
  const uint32_t* pages;        // [pages of the sequence] frame ids, in token order
  uint32_t kv_begin;            // first KV token (a multiple of kTileTokens)
  uint32_t kv_end;              // one past the last KV token any row of this item may see
  uint32_t group;               // query heads per KV head
  uint32_t q_tokens;            // query tokens of this item
  const uint32_t* visible_end;  // [q_tokens] query token i sees KV tokens [0, visible_end[i])
  // [kv_heads][q_tokens * group][head_dim], scaled. The caller's scratch: the kernel may reorder
  // the elements of each row in place (isa_core.inl, bf16_split), so it holds nothing useful after.
  float* q;
  float* m;  // [kv_heads][q_tokens * group] running max; start at -inf
  float* l;  // [kv_heads][q_tokens * group] running sum; start at 0
  float* o;  // [kv_heads][q_tokens * group][head_dim] unnormalised output; start at 0
  // Scratch, 64-byte aligned, for ISAs that take q in bf16: [kv_heads][q_tokens * group]
  // [head_dim] bf16 values.
  uint16_t* q_bf16;
  // Scratch, 64-byte aligned: scores [kv_heads][q_tokens * group][kTileTokens] (a tile's K is
  // scored for every head before softmax), then weights [kv_heads][q_tokens * group].
  float* work;
};

struct IsaKernels {
  Isa isa;
  const char* name;
  // dst[i] = narrow(value(src[i]) * scale) for n elements, from src_dtype to dst_dtype in one
  // pass (the fp8 page codec quantizes and dequantizes with it); to_f32 and from_f32 are it with
  // f32 on one side.
  void (*convert)(const void* src, Dtype src_dtype, float scale, void* dst, Dtype dst_dtype,
                  std::size_t n);
  // dst[i] = value(src[i]) * scale, for n elements of `dtype`.
  void (*to_f32)(const void* src, Dtype dtype, float scale, float* dst, std::size_t n);
  // dst[i] = narrow(src[i] * scale), rounding to nearest even (fp8 saturates at +-448).
  void (*from_f32)(const float* src, float scale, Dtype dtype, void* dst, std::size_t n);
  // max |value(src[i])|; NaN when any element is NaN.
  float (*abs_max)(const void* src, Dtype dtype, std::size_t n);
  // Attention of one work item (see ItemArgs), updating m, l, o.
  void (*attend_item)(const ItemArgs& args);
  // Reads `bytes` (a multiple of 64) with wide loads and folds them into a value the caller
  // must consume: the streaming-read baseline attention is measured against.
  uint64_t (*stream_read)(const void* src, std::size_t bytes);
};

// The table for `isa`, or nullptr when this build or CPU cannot run it. kAuto = best_isa().
const IsaKernels* isa_kernels(Isa isa);
Isa best_isa();
const char* isa_name(Isa isa);

// Defined by the per-ISA files (nullptr where the build has no such file).
const IsaKernels* scalar_kernels();
const IsaKernels* avx2_kernels();
const IsaKernels* avx512_kernels();
const IsaKernels* avx512_bf16_kernels();

}  // namespace kvtier::kernels::cpu
