// Row-dot kernels for AVX2 + FMA + F16C. _mm256_maddubs_epi16 adds two u8 x s8 products into a SATURATING
// int16 (255 * 127 * 2 overflows), so biased codes and codebook values go through the sign trick: with v
// signed, |v| x (xq * sign v) per pair stays within 2 * 128 * 127 = 32512 < 32767. Unbiased codes of 2 or 4
// bits multiply directly; unbiased 8-bit codes (Q5_K, Q5_1: at most 31) stay far below saturation.
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

 private:
  __m256i lut_, bias_;
};

#include "row_dot.inl"

}  // namespace

RowsKernel rows_kernel_avx2(const QuantForm& form) { return pick_kernel(form); }

}  // namespace strata::cpu
