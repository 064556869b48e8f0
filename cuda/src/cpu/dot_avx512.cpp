// Row-dot kernels for AVX-512 VNNI (256-bit vectors, AVX512VL): vpdpbusd multiplies u8 codes by s8
// activations and sums each four products into int32 without saturation. The code bias (and, for codebook
// forms, the +128 that makes the table unsigned) is subtracted in int32 by a second vpdpbusd of the bias.
#include <immintrin.h>

#include <cstring>

#include "dot.hpp"

namespace strata::cpu {
namespace {

#include "code_unpack.inl"

struct IntDot {
  template <CodeKind K, bool Biased>
  static __m256i block(const uint8_t* codes, const int8_t* xq_ptr, __m256i lut, __m256i bias) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq_ptr));
    __m256i u = unpack_codes<K>(codes);
    if constexpr (K == CodeKind::k4Codebook) u = _mm256_shuffle_epi8(lut, u);
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xq);
    if constexpr (!Biased) return dot;
    // Σ (u - bias) xq = Σ u xq - Σ bias xq, both exact in int32.
    return _mm256_sub_epi32(dot, _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xq));
  }

  // The codebook path looks up codebook[c] + 128 (unsigned), so its bias is 128.
  static __m256i bias(const QuantForm& f) {
    return _mm256_set1_epi8(static_cast<char>(f.codebook != Codebook::None ? 128 : f.code_bias));
  }

  static __m256i lut(const QuantForm& f) {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook_values(f.codebook)));
    return _mm256_broadcastsi128_si256(_mm_xor_si128(table, _mm_set1_epi8(static_cast<char>(0x80))));
  }
};

#include "row_dot.inl"

}  // namespace

RowsKernel rows_kernel_avx512(const QuantForm& form) { return pick_kernel(form); }

}  // namespace strata::cpu
