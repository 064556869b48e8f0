// Row helpers shared by the attention and QSA kernels: RMSNorm + partial NEOX RoPE of one head row.
#pragma once

#include "reduce.cuh"

namespace strata::kernels {

// dst[0:d] = rope(rms_norm(src[0:d]) * w) with rotate-half RoPE over dims [0, 2*half) from the table rows
// cos/sin[0:half]; dims beyond pass through. dst is shared memory; every thread of the block calls this, and
// dst is complete on return.
__device__ __forceinline__ void norm_rope_row(const float* src, const float* w, int d, float eps,
                                              const float* cos, const float* sin, int half, float* dst) {
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float x = src[i];
    sum_sq += x * x;
  }
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i] * inv * w[i];
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += blockDim.x) {  // each thread owns the pair (i, i + half)
    const float a = dst[i], b = dst[i + half];
    dst[i] = a * cos[i] - b * sin[i];
    dst[i + half] = b * cos[i] + a * sin[i];
  }
  __syncthreads();
}

}  // namespace strata::kernels
