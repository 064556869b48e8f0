// Row-dot kernels for AVX2 + FMA + F16C. _mm256_maddubs_epi16 adds two u8 x s8 products into a SATURATING
// int16 (255 * 127 * 2 overflows), so biased codes and codebook values go through the sign trick: with v
// signed, |v| x (xq * sign v) per pair stays within 2 * 128 * 127 = 32512 < 32767. Unbiased codes of 2 or 4
// bits multiply directly; unbiased 8-bit codes (Q5_K, Q5_1: at most 31) stay far below saturation. Biased 4-bit
// codes taken two blocks at a time (pair_dot) multiply directly too, and lose their bias in int32.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "dot.hpp"

namespace strata::cpu {
namespace {

#include "code_unpack.inl"

struct IntDot {
  // The sign trick takes each row's own signs, so all a pass shares of an x block is its load.
  using XBlock = __m256i;

  explicit IntDot(const QuantForm& f)
      : lut_(f.codebook == Codebook::None ? _mm256_setzero_si256() : _mm256_broadcastsi128_si256(codebook_table(f))),
        bias_(_mm256_set1_epi8(static_cast<char>(f.code_bias))) {}

  template <bool Biased>
  XBlock x_operand(__m256i xq) const {
    return xq;
  }

  template <CodeKind K, bool Biased>
  __m256i codes_dot(__m256i u, const XBlock& xq) const {
    __m256i pairs;
    if constexpr (!Biased) {
      pairs = _mm256_maddubs_epi16(u, xq);  // codes are the values
    } else {
      // The signed value fits int8 for every form (|v| <= 128), so the wrapping byte subtraction is exact.
      const __m256i v = K == CodeKind::k4Codebook ? _mm256_shuffle_epi8(lut_, u) : _mm256_sub_epi8(u, bias_);
      pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(xq, v));
    }
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }

  // The two halves of a block pair together. Plain 4-bit codes (u <= 15) meet x unsigned, biased or not: u0 x0 +
  // u1 x1 <= 2 * 15 * 128 and the two halves' sum (7680) stay far inside maddubs' int16, and the bias comes
  // off in int32 as Σ bias xq, made here once for every row of the pass. Codebook values (|v| up to 128) keep
  // the sign trick, a half at a time.
  struct XPair {
    __m256i lo, hi, bias_xq;
  };

  template <CodeKind K, bool Biased>
  XPair pair_operand(__m256i xq_lo, __m256i xq_hi) const {
    if constexpr (K != CodeKind::k4 || !Biased) return {xq_lo, xq_hi, _mm256_setzero_si256()};
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(bias_, xq_lo), _mm256_maddubs_epi16(bias_, xq_hi));
    return {xq_lo, xq_hi, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))};
  }

  // codes_dot(u_lo, lo) + codes_dot(u_hi, hi), lane by lane.
  template <CodeKind K, bool Biased>
  __m256i pair_dot(__m256i u_lo, __m256i u_hi, const XPair& x) const {
    if constexpr (K == CodeKind::k4Codebook) {
      return _mm256_add_epi32(codes_dot<K, Biased>(u_lo, x.lo), codes_dot<K, Biased>(u_hi, x.hi));
    } else {
      const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u_lo, x.lo), _mm256_maddubs_epi16(u_hi, x.hi));
      const __m256i dot = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
      if constexpr (!Biased) return dot;
      return _mm256_sub_epi32(dot, x.bias_xq);
    }
  }

 private:
  __m256i lut_, bias_;
};

#include "row_dot.inl"

}  // namespace

RowsKernel rows_kernel_avx2(const QuantForm& form) { return pick_kernel(form); }

}  // namespace strata::cpu
