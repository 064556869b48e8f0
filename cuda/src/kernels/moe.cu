#include "moe.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kDotThreads = 256;   // one CTA for one dot of a few thousand floats
constexpr int kElementThreads = 256;

// expf, not __expf: these kernels are tiny and the gates feed every later layer, so full precision is free.
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void gate_kernel(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ gate,
                            int n) {
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(w[i], x[i], sum);
  sum = block_sum(sum);
  if (threadIdx.x == 0) *gate = sigmoid(sum);
}

__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                              int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

// No __restrict__ on routed/out: they may alias.
__global__ void combine_kernel(const float* routed, const float* __restrict__ shared,
                               const float* __restrict__ gate, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaf(*gate, shared[i], routed[i]);
}

unsigned blocks_for(int n) { return static_cast<unsigned>((n + kElementThreads - 1) / kElementThreads); }

}  // namespace

cudaError_t shared_expert_gate(const float* w, const float* x, float* gate, int n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  gate_kernel<<<1, kDotThreads, 0, stream>>>(w, x, gate, n);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  swiglu_kernel<<<blocks_for(n), kElementThreads, 0, stream>>>(g, u, h, n);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* routed, const float* shared, const float* gate, float* out, int n,
                        cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  combine_kernel<<<blocks_for(n), kElementThreads, 0, stream>>>(routed, shared, gate, out, n);
  return cudaGetLastError();
}

}  // namespace strata::kernels
