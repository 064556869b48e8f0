#include "hc.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

// expf, not __expf: the mixer's gates scale the whole residual, and these kernels are far from the bottleneck.
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

unsigned blocks_for(long n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// No __restrict__: out may alias in.
__global__ void activation_kernel(const float* in, float* out, int n, Activation act, float pre, float post) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = pre * in[i];
  out[i] = post * (act == Activation::Silu ? v * sigmoid(v) : sigmoid(v));
}

__global__ void mix_kernel(const float* __restrict__ up, const float* __restrict__ normed, float* __restrict__ x,
                           int streams, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = 0.0f;
  for (int k = 0; k < streams; ++k) {
    const long at = static_cast<long>(k) * n + i;
    sum = fmaf(sigmoid(up[at]), normed[at], sum);
  }
  x[i] = sum / static_cast<float>(streams);
}

// One thread per element of the streams; y and inj are read by every stream.
__global__ void write_kernel(float* __restrict__ h, const float* __restrict__ inj, const float* __restrict__ y,
                             int streams, int n) {
  const long at = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at >= static_cast<long>(streams) * n) return;
  const int k = static_cast<int>(at / n);
  const int i = static_cast<int>(at % n);
  h[at] = fmaf(inj[k], y[i], h[at]);
}

}  // namespace

cudaError_t scaled_activation(const float* in, float* out, int n, Activation act, float pre, float post,
                              cudaStream_t stream) {
  if (n <= 0 || (act != Activation::Sigmoid && act != Activation::Silu)) return cudaErrorInvalidValue;
  activation_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n, act, pre, post);
  return cudaGetLastError();
}

cudaError_t hc_mix(const float* up, const float* normed, float* x, int streams, int n, cudaStream_t stream) {
  if (streams <= 0 || n <= 0) return cudaErrorInvalidValue;
  mix_kernel<<<blocks_for(n), kThreads, 0, stream>>>(up, normed, x, streams, n);
  return cudaGetLastError();
}

cudaError_t hc_write(float* h, const float* inj, const float* y, int streams, int n, cudaStream_t stream) {
  if (streams <= 0 || n <= 0) return cudaErrorInvalidValue;
  write_kernel<<<blocks_for(static_cast<long>(streams) * n), kThreads, 0, stream>>>(h, inj, y, streams, n);
  return cudaGetLastError();
}

}  // namespace strata::kernels
