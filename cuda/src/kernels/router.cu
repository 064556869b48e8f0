#include <climits>
#include <cmath>

#include "reduce.cuh"
#include "router.cuh"

namespace strata::kernels {
namespace {

// One warp per token: each lane holds the logits of experts lane, lane + 32, ... in registers, so the k
// selection rounds are a register scan and a warp argmax each, without shared memory or block barriers.
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

// Selection runs on the logits themselves: exp is monotone, so their order is the probabilities' order, and
// equal logits are exactly the equal probabilities (float32 exps of distinct logits could collide).
__global__ void __launch_bounds__(32) route_kernel(const float* __restrict__ logits, std::int32_t* __restrict__ ids,
                                                   float* __restrict__ weights, int n_expert, int k) {
  const int lane = threadIdx.x;
  const float* z = logits + static_cast<long>(blockIdx.x) * n_expert;
  float raw[kPerLane];
  unsigned taken = 0;  // bit i: expert lane + 32 i is chosen already, or does not exist
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    raw[i] = e < n_expert ? z[e] : -INFINITY;
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
  if (lane < k) {
    ids[static_cast<long>(blockIdx.x) * k + lane] = chosen_id;
    weights[static_cast<long>(blockIdx.x) * k + lane] = e / sum;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, std::int32_t* ids, float* weights, int tokens, int n_expert, int k,
                      cudaStream_t stream) {
  if (tokens <= 0 || n_expert <= 0 || n_expert > kRouterMaxExperts || k <= 0 || k > kRouterMaxTopK ||
      k > n_expert) {
    return cudaErrorInvalidValue;
  }
  route_kernel<<<static_cast<unsigned>(tokens), 32, 0, stream>>>(logits, ids, weights, n_expert, k);
  return cudaGetLastError();
}

}  // namespace strata::kernels
