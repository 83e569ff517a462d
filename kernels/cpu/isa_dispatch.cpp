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
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
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
    case Isa::kAuto: return true;
  }
  return false;
#else
  return isa == Isa::kScalar || isa == Isa::kAuto;
#endif
}

Isa detect_best() {
  Isa cap = Isa::kAvx512;
  if (const char* env = std::getenv("KVTIER_CPU_ISA"); env != nullptr) {
    const std::string_view v(env);
    if (v == "scalar") {
      cap = Isa::kScalar;
    } else if (v == "avx2") {
      cap = Isa::kAvx2;
    } else if (v != "avx512") {
      log(LogLevel::kWarn, "KVTIER_CPU_ISA='" + std::string(v) +
                               "' is not scalar|avx2|avx512; using the best the CPU supports");
    }
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (static_cast<int>(isa) <= static_cast<int>(cap) && cpu_can_run(isa)) return isa;
  }
  return Isa::kScalar;
}

}  // namespace

#if !defined(KVTIER_KERNELS_X86)
const IsaKernels* avx2_kernels() { return nullptr; }
const IsaKernels* avx512_kernels() { return nullptr; }
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
  }
  return "unknown";
}

}  // namespace kvtier::kernels::cpu
