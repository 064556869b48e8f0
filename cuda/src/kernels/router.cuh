// The MoE router of one decode step (docs/models/qwen3next.md §3.3): softmax over all experts, top-k,
// renormalised by the sum of the k kept probabilities. Launchers never allocate, synchronise or throw: they
// are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

constexpr int kRouterMaxExperts = 1024;
constexpr int kRouterMaxTopK = 16;

// Whether moe_route (and router_publish.cuh's fused launch) takes n_expert experts and the top k of them.
constexpr bool route_shape_fits(int n_expert, int k) {
  return n_expert > 0 && n_expert <= kRouterMaxExperts && k > 0 && k <= kRouterMaxTopK && k <= n_expert;
}

// For each of `tokens` rows of logits [tokens][n_expert] (float32, finite): ids [tokens][k] = the k experts of
// highest probability in descending order, exact ties to the lower index; weights [tokens][k] = their softmax
// probabilities divided by the sum of the k (the softmax denominator cancels in that ratio, so the kernel
// computes exp(z - max z) / Σ_top exp(z - max z) in float32). n_expert <= kRouterMaxExperts,
// 1 <= k <= min(n_expert, kRouterMaxTopK); anything else -> cudaErrorInvalidValue.
cudaError_t moe_route(const float* logits, std::int32_t* ids, float* weights, int tokens, int n_expert, int k,
                      cudaStream_t stream);

}  // namespace strata::kernels
