// The CPU kernels with one lane: the portable fallback, built with the library's baseline flags.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.hpp"
#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels::cpu {
namespace {
// The lane type first, then the code written over it (order matters, so no include sorting).
// clang-format off
#include "kernels/cpu/vec_scalar.inl"
#include "kernels/cpu/isa_core.inl"
// clang-format on

constexpr IsaKernels kScalar = make_kernels<VecScalar>(Isa::kScalar, "scalar");
}  // namespace

const IsaKernels* scalar_kernels() { return &kScalar; }

}  // namespace kvtier::kernels::cpu
