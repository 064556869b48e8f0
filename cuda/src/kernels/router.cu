#include "launch.cuh"
#include "route_select.cuh"
#include "router.cuh"

namespace strata::kernels {
namespace {

// One warp per token.
__global__ void __launch_bounds__(32) route_kernel(const float* __restrict__ logits, std::int32_t* __restrict__ ids,
                                                   float* __restrict__ weights, int n_expert, int k) {
  await_producers();
  release_consumers();
  const int lane = threadIdx.x;
  int id = 0;
  float weight = 0.0f;
  route_top_k(logits + static_cast<long>(blockIdx.x) * n_expert, n_expert, k, lane, id, weight);
  if (lane < k) {
    ids[static_cast<long>(blockIdx.x) * k + lane] = id;
    weights[static_cast<long>(blockIdx.x) * k + lane] = weight;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, std::int32_t* ids, float* weights, int tokens, int n_expert, int k,
                      cudaStream_t stream) {
  if (tokens <= 0 || !route_shape_fits(n_expert, k)) return cudaErrorInvalidValue;
  return launch(route_kernel, static_cast<unsigned>(tokens), 32, 0, stream, logits, ids, weights, n_expert, k);
}

}  // namespace strata::kernels
