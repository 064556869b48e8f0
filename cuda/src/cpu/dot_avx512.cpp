// Row-dot kernels for AVX-512 VNNI (256-bit vectors, AVX512VL): vpdpbusd multiplies u8 codes by s8
// activations and sums each four products into int32 without saturation. The code bias (and, for codebook
// forms, the +128 that makes the table unsigned) is subtracted in int32 by a second vpdpbusd of the bias.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "dot.hpp"

namespace strata::cpu {
namespace {

#include "code_unpack.inl"

struct IntDot {
  // Σ bias xq depends on x alone: a pass computes it once per block for all its rows.
  struct XBlock {
    __m256i xq, bias_xq;
  };

  // The codebook path looks up codebook[c] + 128 (unsigned), so its bias is 128.
  explicit IntDot(const QuantForm& f)
      : lut_(f.codebook == Codebook::None ? _mm256_setzero_si256() : _mm256_broadcastsi128_si256(offset_table(f))),
        bias_(_mm256_set1_epi8(static_cast<char>(f.codebook != Codebook::None ? 128 : f.code_bias))) {}

  // codebook[c] + 128 for each code c.
  static __m128i offset_table(const QuantForm& f) {
    return _mm_xor_si128(codebook_table(f), _mm_set1_epi8(static_cast<char>(0x80)));
  }

  template <bool Biased>
  XBlock x_operand(__m256i xq) const {
    if constexpr (!Biased) return {xq, _mm256_setzero_si256()};
    return {xq, _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias_, xq)};
  }

  template <CodeKind K, bool Biased>
  __m256i codes_dot(__m256i u, const XBlock& x) const {
    if constexpr (K == CodeKind::k4Codebook) u = _mm256_shuffle_epi8(lut_, u);
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x.xq);
    if constexpr (!Biased) return dot;
    // Σ (u - bias) xq = Σ u xq - Σ bias xq, both exact in int32.
    return _mm256_sub_epi32(dot, x.bias_xq);
  }

  // The two halves of a block pair together: Σ bias xq is made once for both.
  struct XPair {
    __m256i lo, hi, bias_xq;
  };

  template <CodeKind K, bool Biased>
  XPair pair_operand(__m256i xq_lo, __m256i xq_hi) const {
    if constexpr (!Biased) return {xq_lo, xq_hi, _mm256_setzero_si256()};
    const __m256i bias_lo = _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias_, xq_lo);
    return {xq_lo, xq_hi, _mm256_dpbusd_epi32(bias_lo, bias_, xq_hi)};
  }

  // codes_dot(u_lo, lo) + codes_dot(u_hi, hi) lane by lane: the second vpdpbusd accumulates onto the first, and
  // one subtraction takes both halves' bias.
  template <CodeKind K, bool Biased>
  __m256i pair_dot(__m256i u_lo, __m256i u_hi, const XPair& x) const {
    if constexpr (K == CodeKind::k4Codebook) {
      u_lo = _mm256_shuffle_epi8(lut_, u_lo);
      u_hi = _mm256_shuffle_epi8(lut_, u_hi);
    }
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u_lo, x.lo), u_hi, x.hi);
    if constexpr (!Biased) return dot;
    return _mm256_sub_epi32(dot, x.bias_xq);
  }

 private:
  __m256i lut_, bias_;
};

#include "row_dot.inl"

}  // namespace

RowsKernel rows_kernel_avx512(const QuantForm& form) { return pick_kernel(form); }

}  // namespace strata::cpu
