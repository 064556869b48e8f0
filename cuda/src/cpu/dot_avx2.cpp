// Row-dot kernels for AVX2 + FMA + F16C. _mm256_maddubs_epi16 adds two u8 x s8 products into a SATURATING
// int16 (255 * 127 * 2 overflows). Codes below 128 (every form but Q8_0 and the codebook forms) meet x unsigned,
// and a biased form's bias comes off in int32. Q8_0's codes (v + 128) and codebook values go through the sign
// trick: with v signed, |v| x (xq * sign v) per pair stays within 2 * 128 * 127 = 32512 < 32767.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "dot.hpp"

namespace strata::cpu {
namespace {

#include "code_unpack.inl"

struct IntDot {
  // Codes below 128 meet x unsigned, biased or not: u0 x0 + u1 x1 <= 2 * 127 * 128 fits maddubs' int16, and a
  // form's bias comes off in int32 as Σ bias xq, which a pass makes once per x block for all its rows.
  template <CodeKind K>
  static constexpr bool kUnsigned = K != CodeKind::k4Codebook && K != CodeKind::k8Wide;

  struct XBlock {
    __m256i xq, bias_xq;
  };

  explicit IntDot(const QuantForm& f)
      : lut_(f.codebook == Codebook::None ? _mm256_setzero_si256() : _mm256_broadcastsi128_si256(codebook_table(f))),
        bias_(_mm256_set1_epi8(static_cast<char>(f.code_bias))) {}

  template <CodeKind K, bool Biased>
  XBlock x_operand(__m256i xq) const {
    if constexpr (!Biased || !kUnsigned<K>) return {xq, _mm256_setzero_si256()};
    return {xq, _mm256_madd_epi16(_mm256_maddubs_epi16(bias_, xq), _mm256_set1_epi16(1))};
  }

  template <CodeKind K, bool Biased>
  __m256i codes_dot(__m256i u, const XBlock& x) const {
    if constexpr (!Biased || kUnsigned<K>) {
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x.xq), _mm256_set1_epi16(1));
      if constexpr (!Biased) return dot;  // codes are the values
      return _mm256_sub_epi32(dot, x.bias_xq);
    } else {
      // The sign trick: the signed value fits int8 for every form (|v| <= 128), so the wrapping byte
      // subtraction is exact.
      const __m256i v = K == CodeKind::k4Codebook ? _mm256_shuffle_epi8(lut_, u) : _mm256_sub_epi8(u, bias_);
      return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x.xq, v)),
                               _mm256_set1_epi16(1));
    }
  }

  // The two halves of a block pair together: plain 4-bit codes (u <= 15) add the halves' int16 pairs before one
  // madd (their sum, at most 2 * 2 * 15 * 128 = 7680, stays inside int16) and lose the bias of both at once;
  // codebook values keep the sign trick, a half at a time.
  struct XPair {
    __m256i lo, hi, bias_xq;
  };

  template <CodeKind K, bool Biased>
  XPair pair_operand(__m256i xq_lo, __m256i xq_hi) const {
    if constexpr (!Biased || !kUnsigned<K>) return {xq_lo, xq_hi, _mm256_setzero_si256()};
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(bias_, xq_lo), _mm256_maddubs_epi16(bias_, xq_hi));
    return {xq_lo, xq_hi, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))};
  }

  // codes_dot(u_lo, lo) + codes_dot(u_hi, hi), lane by lane.
  template <CodeKind K, bool Biased>
  __m256i pair_dot(__m256i u_lo, __m256i u_hi, const XPair& x) const {
    if constexpr (K == CodeKind::k4Codebook) {
      const XBlock lo{x.lo, _mm256_setzero_si256()}, hi{x.hi, _mm256_setzero_si256()};  // no bias: the sign trick
      return _mm256_add_epi32(codes_dot<K, Biased>(u_lo, lo), codes_dot<K, Biased>(u_hi, hi));
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
