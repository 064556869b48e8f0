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

__global__ void slots_kernel(const int* __restrict__ slot_of, const int* __restrict__ ids, int* __restrict__ slots,
                             int k) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < k) slots[j] = slot_of[ids[j]];
}

// A branch, not a multiplication by zero: a skipped product's row was never written (NaN poison stays out), and
// j runs in one fixed order so the sum is the same bits on every run.
__global__ void cached_sum_kernel(const float* rows, const int* __restrict__ slots,
                                  const float* __restrict__ weights, int k, int n, bool accumulate, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    if (slots[j] >= 0) sum = fmaf(weights[j], rows[static_cast<long>(j) * n + i], sum);
  }
  out[i] = accumulate ? out[i] + sum : sum;
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

cudaError_t expert_slots(const int* slot_of, const int* ids, int* slots, int k, cudaStream_t stream) {
  if (k <= 0) return cudaErrorInvalidValue;
  slots_kernel<<<blocks_for(k), kElementThreads, 0, stream>>>(slot_of, ids, slots, k);
  return cudaGetLastError();
}

cudaError_t moe_cached_sum(const float* rows, const int* slots, const float* weights, int k, int n, bool accumulate,
                           float* out, cudaStream_t stream) {
  if (k <= 0 || n <= 0) return cudaErrorInvalidValue;
  cached_sum_kernel<<<blocks_for(n), kElementThreads, 0, stream>>>(rows, slots, weights, k, n, accumulate, out);
  return cudaGetLastError();
}

}  // namespace strata::kernels
