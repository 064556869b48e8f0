// The hyper-connection mixer's gates as device code, shared by the chained kernels (hc.cu) and the fused read
// (hc_read.cu) so that both compute the same bits.
#pragma once

#include "hc.cuh"

namespace strata::kernels {

// expf, not __expf: the mixer's gates scale the whole residual, and these kernels are far from the bottleneck.
__device__ __forceinline__ float hc_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// post * act(pre * in): scaled_activation's element.
__device__ __forceinline__ float hc_activation(float in, Activation act, float pre, float post) {
  const float v = pre * in;
  return post * (act == Activation::Silu ? v * hc_sigmoid(v) : hc_sigmoid(v));
}

// One stream's term of the block input's sum: sum + sigmoid(up) * normed (hc_mix divides by the streams).
__device__ __forceinline__ float hc_mix_term(float up, float normed, float sum) {
  return fmaf(hc_sigmoid(up), normed, sum);
}

}  // namespace strata::kernels
