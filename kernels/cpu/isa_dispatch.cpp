#if defined(KVTIER_KERNELS_X86)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <string>
#include <string_view>

#include "kernels/cpu/isa.hpp"
#include "kvtier/log.hpp"

namespace kvtier::kernels::cpu {
namespace {

#if defined(KVTIER_KERNELS_X86)
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

// AVX512_BF16 from CPUID leaf 7 subleaf 1 (EAX bit 5); older compilers' __builtin_cpu_supports
// do not know it either. The OS side (ZMM state enabled in XCR0) is what avx512f already implies.
// Read once: isa_kernels() runs per attention call, and CPUID traps to the hypervisor in a VM.
bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    return (eax & (1u << 5)) != 0;
  }();
  return has;
}
#endif

bool cpu_can_run(Isa isa) {
#if defined(KVTIER_KERNELS_X86)
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::kAvx512Bf16:
      return avx512_bf16_kernels() != nullptr && cpu_can_run(Isa::kAvx512) &&
             cpu_has_avx512_bf16() && __builtin_cpu_supports("avx512vbmi");
    case Isa::kAuto: return true;
  }
  return false;
#else
  return isa == Isa::kScalar || isa == Isa::kAuto;
#endif
}

// The exact-fp32 kernels unless KVTIER_CPU_ISA asks for avx512_bf16: the default CPU kernels are
// the reference that CUDA kernels and engines are checked against, and the bf16 rounding of q and
// the softmax weights buys nothing for decode from memory (prefill gains 37 %; see isa_core.inl).
Isa detect_best() {
  Isa cap = Isa::kAvx512;
  if (const char* env = std::getenv("KVTIER_CPU_ISA"); env != nullptr) {
    const std::string_view v(env);
    if (v == "scalar") {
      cap = Isa::kScalar;
    } else if (v == "avx2") {
      cap = Isa::kAvx2;
    } else if (v == "avx512") {
      cap = Isa::kAvx512;
    } else if (v == "avx512_bf16") {
      cap = Isa::kAvx512Bf16;
    } else {
      log(LogLevel::kWarn,
          "KVTIER_CPU_ISA='" + std::string(v) +
              "' is not scalar|avx2|avx512|avx512_bf16; using the best the CPU supports");
    }
  }
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2}) {
    if (static_cast<int>(isa) <= static_cast<int>(cap) && cpu_can_run(isa)) return isa;
  }
  return Isa::kScalar;
}

}  // namespace

#if !defined(KVTIER_KERNELS_X86)
const IsaKernels* avx2_kernels() { return nullptr; }
const IsaKernels* avx512_kernels() { return nullptr; }
#endif
#if !defined(KVTIER_KERNELS_AVX512_BF16)
// The compiler could not build the AVX512_BF16 file (or this is not x86-64).
const IsaKernels* avx512_bf16_kernels() { return nullptr; }
#endif

Isa best_isa() {
  static const Isa best = detect_best();
  return best;
}

const IsaKernels* isa_kernels(Isa isa) {
  if (isa == Isa::kAuto) isa = best_isa();
  if (!cpu_can_run(isa)) return nullptr;
  switch (isa) {
    case Isa::kScalar: return scalar_kernels();
    case Isa::kAvx2: return avx2_kernels();
    case Isa::kAvx512: return avx512_kernels();
    case Isa::kAvx512Bf16: return avx512_bf16_kernels();
    case Isa::kAuto: break;
  }
  return nullptr;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

}  // namespace kvtier::kernels::cpu
