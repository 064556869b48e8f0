// Float row-dot kernels for AVX-512 (F): 16 float32 lanes per vector, 512-bit, since a float row is 2 or 4
// bytes a weight and the wider loads halve the instructions per byte streamed; f16 widens by vcvtph2ps, bf16
// by zero-extending each 16-bit pattern to 32 bits and shifting it into the high half (exact for every value).
#include <immintrin.h>

#include "dot.hpp"

namespace strata::cpu {
namespace {

struct FloatVec {
  using V = __m512;
  static constexpr int64_t kLanes = 16;

  template <FloatKind K>
  static V weights(const uint8_t* p) {
    if constexpr (K == FloatKind::F32) {
      return _mm512_loadu_ps(p);
    } else {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (K == FloatKind::F16) return _mm512_cvtph_ps(bits);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
  }

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};

#include "float_dot.inl"

}  // namespace

RowsKernel float_rows_kernel_avx512(FloatKind kind) { return pick_float_kernel(kind); }

}  // namespace strata::cpu
