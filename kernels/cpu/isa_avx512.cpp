// The CPU kernels compiled for AVX-512 (F/BW/VL/DQ); this file alone gets those flags.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.hpp"

namespace kvtier::kernels::cpu {
namespace {
// The lane type first, then the code written over it (order matters, so no include sorting).
// clang-format off
#include "kernels/cpu/vec_avx512.inl"
#include "kernels/cpu/isa_core.inl"
// clang-format on

constexpr IsaKernels kAvx512 = make_kernels<VecAvx512>(Isa::kAvx512, "avx512");
}  // namespace

const IsaKernels* avx512_kernels() { return &kAvx512; }

}  // namespace kvtier::kernels::cpu
