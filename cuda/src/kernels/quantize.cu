#include "launch.cuh"
#include "q8_32_blocks.cuh"
#include "quantize.cuh"

namespace strata::kernels {
namespace {

constexpr int kQuantizeThreads = 256;  // 8 blocks of 32 per CTA, one warp each

// One warp per 32-element block, one element per lane.
__global__ void quantize_q8_32_kernel(const float* __restrict__ x, Q8Blocks q8, long n) {
  await_producers();
  release_consumers();
  const long at = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at >= n) return;  // whole warps leave together: n is a multiple of 32
  store_q8_32(x[at], q8, at);
}

}  // namespace

cudaError_t quantize_q8_32(const float* x, std::int8_t* xq, float* dx, std::int32_t* sums, long n,
                           cudaStream_t stream) {
  if (n <= 0 || n % kQ8Block != 0 || xq == nullptr) return cudaErrorInvalidValue;
  const long threads = n;  // one thread per element
  const long grid = (threads + kQuantizeThreads - 1) / kQuantizeThreads;
  return launch(quantize_q8_32_kernel, static_cast<unsigned>(grid), kQuantizeThreads, 0, stream, x,
                Q8Blocks{xq, dx, sums}, n);
}

}  // namespace strata::kernels
