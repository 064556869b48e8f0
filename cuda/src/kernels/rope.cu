#include <cmath>

#include "launch.cuh"
#include "rope.cuh"

namespace strata::kernels {
namespace {

constexpr int kRopeThreads = 128;

// One CTA per (token, head); one thread per rotated pair.
__global__ void rope_neox_kernel(float* __restrict__ x, const std::int32_t* __restrict__ positions,
                                 const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                 int heads, int head_dim, int half) {
  await_producers();
  release_consumers();
  const long token = blockIdx.x / heads;
  float* xh = x + static_cast<long>(blockIdx.x) * head_dim;
  const long row = static_cast<long>(positions[token]) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float c = cos_table[row + i], s = sin_table[row + i];
    const float a = xh[i], b = xh[i + half];
    xh[i] = a * c - b * s;
    xh[i + half] = b * c + a * s;
  }
}

}  // namespace

void build_rope_tables(float* cos_table, float* sin_table, int max_position, int rope_dim, double theta) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, 2.0 * i / rope_dim);
    for (int p = 0; p < max_position; ++p) {
      const double angle = p * inv_freq;
      cos_table[static_cast<long>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_table[static_cast<long>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

cudaError_t rope_neox(float* x, const std::int32_t* positions, const float* cos_table, const float* sin_table,
                      int tokens, int heads, int head_dim, int rope_dim, cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > head_dim)
    return cudaErrorInvalidValue;
  return launch(rope_neox_kernel, static_cast<unsigned>(tokens) * heads, kRopeThreads, 0, stream, x, positions,
                cos_table, sin_table, heads, head_dim, rope_dim / 2);
}

}  // namespace strata::kernels
