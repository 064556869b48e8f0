// The router's selection in one warp (router.cu's moe_route and router_publish.cu's fused launch share it):
// softmax over the experts, the top k in descending order with exact ties to the lower index, renormalised.
#pragma once

#include <climits>
#include <cmath>

#include "reduce.cuh"
#include "router.cuh"

namespace strata::kernels {
namespace route_select {

// Each lane holds the logits of experts lane, lane + 32, ... in registers, so the k selection rounds are a
// register scan and a warp argmax each, without shared memory or block barriers.
constexpr int kPerLane = kRouterMaxExperts / 32;

// The total order of the selection: higher value first, and of equal values the lower index.
__device__ __forceinline__ bool precedes(float value, int index, float other_value, int other_index) {
  return value > other_value || (value == other_value && index < other_index);
}

__device__ __forceinline__ void warp_argmax(float& value, int& index) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (precedes(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
}

}  // namespace route_select

// Called by all 32 lanes of a warp on logits z [n_expert] (n_expert <= kRouterMaxExperts, 1 <= k <=
// min(n_expert, 32)): lane j < k gets the j-th choice, its id and its weight exp(z - max) / Σ_top exp(z - max)
// in float32. z is read through L2 (ld.global.cg): another CTA of the same launch may have written it.
// Selection runs on the logits themselves: exp is monotone, so their order is the probabilities' order, and
// equal logits are exactly the equal probabilities (float32 exps of distinct logits could collide).
__device__ __forceinline__ void route_top_k(const float* z, int n_expert, int k, int lane, int& id, float& weight) {
  using namespace route_select;
  float raw[kPerLane];
  unsigned taken = 0;  // bit i: expert lane + 32 i is chosen already, or does not exist
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    raw[i] = e < n_expert ? __ldcg(z + e) : -INFINITY;
    if (e >= n_expert) taken |= 1u << i;
  }
  // Lane j keeps the j-th choice, so the weights are computed in parallel from registers.
  float chosen_raw = 0.0f, top = 0.0f;
  int chosen_id = 0;
  for (int j = 0; j < k; ++j) {
    float best_value = -INFINITY, best_raw = -INFINITY;
    int best_index = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float value = isnan(raw[i]) ? -INFINITY : raw[i];  // a NaN is still chosen in its turn (and poisons)
      if (!((taken >> i) & 1u) && precedes(value, lane + 32 * i, best_value, best_index)) {
        best_value = value;
        best_raw = raw[i];
        best_index = lane + 32 * i;
      }
    }
    warp_argmax(best_value, best_index);
    const int owner = best_index & 31;  // its own best is the winner
    const float winner_raw = __shfl_sync(0xffffffffu, best_raw, owner);
    if (lane == owner) taken |= 1u << (best_index >> 5);
    if (lane == j) {
      chosen_raw = winner_raw;
      chosen_id = best_index;
    }
    // The first is the largest logit: every exp is <= 1 and the first is exactly 1, so the sum is >= 1.
    if (j == 0) top = winner_raw;
  }
  const float e = lane < k ? expf(chosen_raw - top) : 0.0f;
  const float sum = warp_sum(e);
  id = chosen_id;
  weight = e / sum;
}

}  // namespace strata::kernels
