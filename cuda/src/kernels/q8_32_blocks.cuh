// The q8_32 quantization of one block of 32 floats by one warp (docs/forms.md, "Activation contract"): the one
// definition that quantize_q8_32 and every kernel writing an activation's q8_32 form beside its floats share,
// so that the forms agree bit for bit. Device code, internal to the kernels.
#pragma once

#include <cstdint>

#include "quantize.cuh"

namespace strata::kernels {

// Element `at` of an activation, held by one lane of a whole warp whose 32 lanes hold one block in lane order
// (lane i: element 32 * (at / 32) + i): writes its code and, from the block's first lane, the block's dx and
// code sum. Every lane of the warp calls it (it shuffles across the warp). With no codes (none asked for) it
// returns at once.
__device__ __forceinline__ void store_q8_32(float v, const Q8Blocks& q8, long at) {
  if (q8.xq == nullptr) return;
  float amax = fabsf(v);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float d = amax / 127.0f;  // IEEE division, as numpy: the same dx bit for bit
  int q = 0;
  if (d != 0.0f) {
    // roundf rounds half away from zero; the clamp matters only for subnormal d, where v / d loses precision.
    q = static_cast<int>(fminf(fmaxf(roundf(v / d), -127.0f), 127.0f));
  }
  q8.xq[at] = static_cast<std::int8_t>(q);
  int sum = q;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (at % kQ8Block == 0) {
    q8.dx[at / kQ8Block] = d;
    q8.sums[at / kQ8Block] = sum;
  }
}

}  // namespace strata::kernels
