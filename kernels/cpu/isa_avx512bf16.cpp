// The CPU kernels compiled for AVX-512 plus AVX512_BF16 and AVX512_VBMI; this file alone gets
// those flags. Only bf16 and fp8 attention differ from the AVX-512 table (vdpbf16ps, fp8 widened
// by vpermi2b tables, see isa_core.inl and vec_avx512bf16.inl); the conversions, abs_max and the
// streaming baseline are the same code compiled with two more flags.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.hpp"

namespace kvtier::kernels::cpu {
namespace {
// The lane types first, then the code written over them (order matters, so no include sorting).
// clang-format off
#include "kernels/cpu/vec_avx512.inl"
#include "kernels/cpu/vec_avx512bf16.inl"
#include "kernels/cpu/isa_core.inl"
// clang-format on

constexpr IsaKernels kAvx512Bf16 = make_kernels<VecAvx512Bf16>(Isa::kAvx512Bf16, "avx512_bf16");
}  // namespace

const IsaKernels* avx512_bf16_kernels() { return &kAvx512Bf16; }

}  // namespace kvtier::kernels::cpu
