#include "quantize.cuh"

namespace strata::kernels {
namespace {

constexpr int kQuantizeThreads = 256;  // 8 blocks of 32 per CTA, one warp each

// One warp per 32-element block, one element per lane.
__global__ void quantize_q8_32_kernel(const float* __restrict__ x, std::int8_t* __restrict__ xq,
                                      float* __restrict__ dx, std::int32_t* __restrict__ sums, long n_blocks) {
  const long block = (static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x) / kQ8Block;
  if (block >= n_blocks) return;  // whole warps leave together: n is a multiple of 32
  const int lane = threadIdx.x & 31;
  const float v = x[block * kQ8Block + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float d = amax / 127.0f;  // IEEE division, as numpy: the same dx bit for bit
  int q = 0;
  if (d != 0.0f) {
    // roundf rounds half away from zero; the clamp matters only for subnormal d, where v / d loses precision.
    q = static_cast<int>(fminf(fmaxf(roundf(v / d), -127.0f), 127.0f));
  }
  xq[block * kQ8Block + lane] = static_cast<std::int8_t>(q);
  int sum = q;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    dx[block] = d;
    sums[block] = sum;
  }
}

}  // namespace

cudaError_t quantize_q8_32(const float* x, std::int8_t* xq, float* dx, std::int32_t* sums, long n,
                           cudaStream_t stream) {
  if (n <= 0 || n % kQ8Block != 0) return cudaErrorInvalidValue;
  const long threads = n;  // one thread per element
  const long grid = (threads + kQuantizeThreads - 1) / kQuantizeThreads;
  quantize_q8_32_kernel<<<static_cast<unsigned>(grid), kQuantizeThreads, 0, stream>>>(x, xq, dx, sums,
                                                                                       n / kQ8Block);
  return cudaGetLastError();
}

}  // namespace strata::kernels
