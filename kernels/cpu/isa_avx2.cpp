// The CPU kernels compiled for AVX2 + FMA + F16C; this file alone gets those flags.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.hpp"

namespace kvtier::kernels::cpu {
namespace {
// The lane type first, then the code written over it (order matters, so no include sorting).
// clang-format off
#include "kernels/cpu/vec_avx2.inl"
#include "kernels/cpu/isa_core.inl"
// clang-format on

constexpr IsaKernels kAvx2 = make_kernels<VecAvx2>(Isa::kAvx2, "avx2");
}  // namespace

const IsaKernels* avx2_kernels() { return &kAvx2; }

}  // namespace kvtier::kernels::cpu
