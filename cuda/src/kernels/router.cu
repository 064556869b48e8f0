#include <climits>
#include <cmath>

#include "router.cuh"

namespace strata::kernels {
namespace {

constexpr int kRouterThreads = 256;  // one CTA per token; up to 4 experts per thread

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

// Index of the first (value, index) of the block under `precedes`; every thread gets it. A thread without a
// candidate passes (-inf, INT_MAX), which any real candidate precedes.
__device__ int block_argmax(float value, int index) {
  __shared__ float values[32];
  __shared__ int indices[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  warp_argmax(value, index);
  __syncthreads();  // values[] may still be read by the previous call
  if (lane == 0) {
    values[warp] = value;
    indices[warp] = index;
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  value = lane < warps ? values[lane] : -INFINITY;
  index = lane < warps ? indices[lane] : INT_MAX;
  warp_argmax(value, index);
  return index;
}

// Selection runs on the logits themselves: exp is monotone, so their order is the probabilities' order, and
// equal logits are exactly the equal probabilities (float32 exps of distinct logits could collide).
__global__ void route_kernel(const float* __restrict__ logits, std::int32_t* __restrict__ ids,
                             float* __restrict__ weights, int n_expert, int k) {
  __shared__ float z[kRouterMaxExperts];
  __shared__ bool taken[kRouterMaxExperts];
  __shared__ int chosen[kRouterMaxTopK];
  const long row = blockIdx.x;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
    z[e] = logits[row * n_expert + e];
    taken[e] = false;
  }
  __syncthreads();
  for (int j = 0; j < k; ++j) {
    float best_value = -INFINITY;
    int best_index = INT_MAX;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
      const float value = isnan(z[e]) ? -INFINITY : z[e];  // a NaN is still chosen (and poisons the weights)
      if (!taken[e] && precedes(value, e, best_value, best_index)) {
        best_value = value;
        best_index = e;
      }
    }
    const int winner = block_argmax(best_value, best_index);
    if (threadIdx.x == 0) {
      chosen[j] = winner;
      taken[winner] = true;
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  // chosen[0] holds the largest logit: every exp is <= 1 and the first is exactly 1, so the sum is >= 1.
  const float top = z[chosen[0]];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += expf(z[chosen[j]] - top);
  for (int j = 0; j < k; ++j) {
    ids[row * k + j] = chosen[j];
    weights[row * k + j] = expf(z[chosen[j]] - top) / sum;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, std::int32_t* ids, float* weights, int tokens, int n_expert, int k,
                      cudaStream_t stream) {
  if (tokens <= 0 || n_expert <= 0 || n_expert > kRouterMaxExperts || k <= 0 || k > kRouterMaxTopK ||
      k > n_expert) {
    return cudaErrorInvalidValue;
  }
  route_kernel<<<static_cast<unsigned>(tokens), kRouterThreads, 0, stream>>>(logits, ids, weights, n_expert, k);
  return cudaGetLastError();
}

}  // namespace strata::kernels
