// Float row-dot kernels for AVX2 + FMA + F16C: 8 float32 lanes per vector; f16 widens by vcvtph2ps, bf16 by
// zero-extending each 16-bit pattern to 32 bits and shifting it into the high half (exact for every value).
#include <immintrin.h>

#include "dot.hpp"

namespace strata::cpu {
namespace {

struct FloatVec {
  using V = __m256;
  static constexpr int64_t kLanes = 8;

  template <FloatKind K>
  static V weights(const uint8_t* p) {
    if constexpr (K == FloatKind::F32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if constexpr (K == FloatKind::F16) return _mm256_cvtph_ps(bits);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
  }

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }

  static float sum(V v) {
    const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
  }
};

#include "float_dot.inl"

}  // namespace

RowsKernel float_rows_kernel_avx2(FloatKind kind) { return pick_float_kernel(kind); }

}  // namespace strata::cpu
