#include "kv_rotation.cuh"

#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kRotateThreads = 128;

__global__ void kv_rotate_kernel(const float* in, float* out, int d) {
  await_producers();
  release_consumers();
  extern __shared__ float row[];
  const long base = static_cast<long>(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) row[i] = in[base + i];
  __syncthreads();
  kv_rotate_row(row, d);
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[base + i] = row[i];
}

}  // namespace

cudaError_t kv_rotate(const float* in, float* out, int rows, int head_dim, cudaStream_t stream) {
  if (rows <= 0 || head_dim <= 0 || head_dim % 32 != 0) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  return launch(kv_rotate_kernel, rows, kRotateThreads, smem, stream, in, out, head_dim);
}

}  // namespace strata::kernels
