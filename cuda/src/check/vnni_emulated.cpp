// The AVX-512 row kernels' source compiled for AVX2, with vpdpbusd emulated: CI's machines lack AVX-512, and
// without this the VNNI IntDot (cuda/src/cpu/int_dot_vnni.inl) would be checked only on the GPU box. The tests
// hold it to the AVX2 kernels bit for bit (both make the same exact int32 dots, then share row_dot.inl), and
// where the CPU has AVX-512 VNNI, to the instruction itself, which checks the emulation.
#include "vnni_emulated.hpp"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace strata::cpu {
namespace {

// vpdpbusd: lane i of src + Σ_{j<4} a[4i + j] (unsigned) * b[4i + j] (signed), in int32 without saturation.
__m256i emulated_dpbusd(__m256i src, __m256i a, __m256i b) {
  int32_t sum[8];
  uint8_t u[32];
  int8_t s[32];
  std::memcpy(sum, &src, sizeof(sum));
  std::memcpy(u, &a, sizeof(u));
  std::memcpy(s, &b, sizeof(s));
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) sum[i] += int32_t{u[4 * i + j]} * int32_t{s[4 * i + j]};
  __m256i out;
  std::memcpy(&out, sum, sizeof(out));
  return out;
}

#define _mm256_dpbusd_epi32 emulated_dpbusd
#include "../cpu/code_unpack.inl"
#include "../cpu/int_dot_vnni.inl"
#include "../cpu/row_dot.inl"
#undef _mm256_dpbusd_epi32

}  // namespace
}  // namespace strata::cpu

namespace strata::pool_check {

cpu::RowsKernel emulated_vnni_kernel(const QuantForm& form) { return cpu::pick_kernel(form); }

}  // namespace strata::pool_check
