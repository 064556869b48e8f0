// The q8_32 quantization of blocks of 32 floats by one warp (docs/forms.md, "Activation contract"): the one
// definition that quantize_q8_32 and every kernel writing an activation's q8_32 form beside its floats share,
// so that the forms agree bit for bit. Device code, internal to the kernels.
#pragma once

#include <cstdint>

#include "quantize.cuh"

namespace strata::kernels {

// Elements at[u] of U blocks an activation's warp holds at once, one value per lane and block (lane i:
// element 32 * (at[u] / 32) + i): writes each live block's codes and, from its first lane, its dx and code sum
// (bit u of `live` set: block u is real; a clear bit is padding that every lane still carries, so that the warp
// stays whole for the shuffles). The U reductions step together, so their shuffle chains overlap instead of
// running one after another. Every lane of the warp calls it. With no codes (none asked for) it returns at once.
template <int U>
__device__ __forceinline__ void store_q8_32_blocks(const float (&v)[U], const Q8Blocks& q8, const long (&at)[U],
                                                   unsigned live) {
  if (q8.xq == nullptr) return;
  float amax[U];
#pragma unroll
  for (int u = 0; u < U; ++u) amax[u] = fabsf(v[u]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int u = 0; u < U; ++u) amax[u] = fmaxf(amax[u], __shfl_xor_sync(0xffffffffu, amax[u], offset));
  }
  float d[U];
  int sum[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    d[u] = amax[u] / 127.0f;  // IEEE division, as numpy: the same dx bit for bit
    int q = 0;
    if (d[u] != 0.0f) {
      // roundf rounds half away from zero; the clamp matters only for subnormal d, where v / d loses precision.
      q = static_cast<int>(fminf(fmaxf(roundf(v[u] / d[u]), -127.0f), 127.0f));
    }
    if (live >> u & 1u) q8.xq[at[u]] = static_cast<std::int8_t>(q);
    sum[u] = q;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int u = 0; u < U; ++u) sum[u] += __shfl_xor_sync(0xffffffffu, sum[u], offset);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if ((live >> u & 1u) && at[u] % kQ8Block == 0) {
      q8.dx[at[u] / kQ8Block] = d[u];
      q8.sums[at[u] / kQ8Block] = sum[u];
    }
  }
}

// One block: element `at`, held by one lane of a whole warp whose 32 lanes hold its block in lane order.
__device__ __forceinline__ void store_q8_32(float v, const Q8Blocks& q8, long at) {
  const float one[1] = {v};
  const long where[1] = {at};
  store_q8_32_blocks<1>(one, q8, where, 1u);
}

}  // namespace strata::kernels
