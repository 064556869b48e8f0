// Run-time ISA choice: cpuid for the instruction sets, XGETBV for the OS saving the wider registers.
#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata::cpu {
namespace {

struct CpuidLeaf7 {
  unsigned ebx = 0, ecx = 0;
};

unsigned leaf1_ecx() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) ? c : 0;
}

CpuidLeaf7 leaf7() {
  unsigned a, b, c, d;
  CpuidLeaf7 leaf;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) leaf = {b, c};
  return leaf;
}

// XCR0: which register states the OS saves on context switch (bits 1-2: SSE/AVX, 5-7: AVX-512).
unsigned long long xcr0() {
  if (!(leaf1_ecx() & bit_OSXSAVE)) return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

}  // namespace

bool cpu_has_avx2() {
  const unsigned c1 = leaf1_ecx();
  const bool os_ymm = (xcr0() & 0x6) == 0x6;
  return os_ymm && (c1 & bit_FMA) && (c1 & bit_F16C) && (c1 & bit_AVX) && (leaf7().ebx & bit_AVX2);
}

bool cpu_has_avx512_vnni() {
  const CpuidLeaf7 l7 = leaf7();
  const bool os_zmm = (xcr0() & 0xE6) == 0xE6;
  return os_zmm && cpu_has_avx2() && (l7.ebx & bit_AVX512F) && (l7.ebx & bit_AVX512BW) && (l7.ebx & bit_AVX512VL) &&
         (l7.ecx & bit_AVX512VNNI);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    default: return "auto";
  }
}

Isa resolve_isa(Isa requested) {
  if (requested == Isa::kAuto) {
    const char* env = std::getenv("STRATA_CPU_ISA");
    if (env != nullptr && *env != '\0') {
      if (std::strcmp(env, "avx2") == 0) requested = Isa::kAvx2;
      else if (std::strcmp(env, "avx512") == 0) requested = Isa::kAvx512;
      else STRATA_EXPECTS(false, InvalidArgument,
                          std::string("STRATA_CPU_ISA must be avx2 or avx512, found '") + env + "'");
    }
  }
  if (requested == Isa::kAuto) {
    STRATA_EXPECTS(cpu_has_avx2(), InvalidArgument, "the CPU expert pool needs AVX2+FMA+F16C; this CPU lacks them");
    return cpu_has_avx512_vnni() ? Isa::kAvx512 : Isa::kAvx2;
  }
  if (requested == Isa::kAvx512)
    STRATA_EXPECTS(cpu_has_avx512_vnni(), InvalidArgument,
                   "ISA avx512 requested, but this CPU lacks AVX-512 F/BW/VL/VNNI");
  else
    STRATA_EXPECTS(cpu_has_avx2(), InvalidArgument, "ISA avx2 requested, but this CPU lacks AVX2+FMA+F16C");
  return requested;
}

}  // namespace strata::cpu
