#include "norm.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kNormThreads = 256;

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int cols, float eps) {
  const long row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(sum_sq) / static_cast<float>(cols) + eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int cols, float eps,
                     cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaErrorInvalidValue;
  rms_norm_kernel<<<rows, kNormThreads, 0, stream>>>(x, w, y, cols, eps);
  return cudaGetLastError();
}

}  // namespace strata::kernels
