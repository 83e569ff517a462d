// Exhaustive checks over all 2^32 float bit patterns (label `slow`: minutes on two cores): the
// scalar float -> f16 / bf16 / fp8 encoders against the nearest-even reference, and every SIMD
// encoder against the scalar one, bit for bit (NaN: both NaN).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/numeric_formats.hpp"
#include "tests/kernels/numeric_reference.hpp"

namespace kvtier::kernels {
namespace {

TEST(NumericFormatsExhaustive, EncodersAreNearestEvenOnAllFloats) {
  testing::sweep_floats(1, testing::check_encoders_against_reference);
}

TEST(NumericFormatsExhaustive, SimdEncodersEqualScalarOnAllFloats) {
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<float> in(kChunk);
  std::vector<uint8_t> out(4 * kChunk);
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Bf16}) {
    const cpu::IsaKernels* k = cpu::isa_kernels(isa);
    if (k == nullptr) continue;
    for (uint64_t base = 0; base < (1ull << 32); base += kChunk) {
      for (uint64_t i = 0; i < kChunk; ++i)
        in[i] = std::bit_cast<float>(static_cast<uint32_t>(base + i));
      for (Dtype d : {Dtype::kF16, Dtype::kBF16, Dtype::kFP8E4M3}) {
        k->from_f32(in.data(), 1.0f, d, out.data(), kChunk);
        for (uint64_t i = 0; i < kChunk; ++i) {
          const float got = load_as_float(out.data(), d, i);
          uint8_t one[4];
          store_from_float(one, d, 0, in[i]);
          const float want = load_as_float(one, d, 0);
          if (std::isnan(got) && std::isnan(want)) continue;
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
              << cpu::isa_name(isa) << " " << dtype_name(d) << " input bits " << std::hex
              << (base + i);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::kernels
