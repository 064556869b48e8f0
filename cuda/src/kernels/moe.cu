#include "launch.cuh"
#include "moe.cuh"
#include "q8_32_blocks.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kDotThreads = 256;   // one CTA for one dot of a few thousand floats
constexpr int kElementThreads = 256;

// expf, not __expf: these kernels are tiny and the gates feed every later layer, so full precision is free.
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__device__ __forceinline__ long element_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }

// One CTA per row of x.
__global__ void gate_kernel(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ gate,
                            int n) {
  await_producers();
  release_consumers();
  const float* row = x + static_cast<long>(blockIdx.x) * n;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(w[i], row[i], sum);
  sum = block_sum(sum);
  if (threadIdx.x == 0) gate[blockIdx.x] = sigmoid(sum);
}

__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                              int n, Q8Blocks h_q8) {
  await_producers();
  release_consumers();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;  // with h_q8, whole warps leave together: n is a multiple of 32
  const float v = g[i] * sigmoid(g[i]) * u[i];
  h[i] = v;
  store_q8_32(v, h_q8, i);
}

// No __restrict__ on routed/out: they may alias.
__global__ void combine_kernel(const float* routed, const float* __restrict__ shared,
                               const float* __restrict__ gate, float* out, int n, long elements) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at < elements) out[at] = fmaf(gate[at / n], shared[at], routed[at]);
}

// Σ over j < k with row_of(j) >= 0 of weights[j] * rows[row_of(j)][i]: one fma per j in the order j = 0..k-1
// from 0, so the sum is the same bits on every run. A branch, not a multiplication by zero: a skipped row may
// never have been written (NaN poison stays out).
template <class RowOf>
__device__ __forceinline__ float weighted_row_sum(const float* rows, const float* weights, int k, int n, int i,
                                                  RowOf row_of) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const long r = row_of(j);
    if (r >= 0) sum = fmaf(weights[j], rows[r * n + i], sum);
  }
  return sum;
}

// One thread per element of out [tokens][n]; token t's products are rows t*k .. t*k+k-1.
__global__ void cached_sum_kernel(const float* rows, const int* __restrict__ slots,
                                  const float* __restrict__ weights, int k, int n, bool accumulate, float* out,
                                  long elements) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at >= elements) return;
  const long first = at / n * k;
  const float sum = weighted_row_sum(rows, weights + first, k, n, static_cast<int>(at % n),
                                     [&](int j) { return slots[first + j] >= 0 ? first + j : -1L; });
  out[at] = accumulate ? out[at] + sum : sum;
}

__global__ void weighted_rows_kernel(const float* rows, const int* __restrict__ row_of,
                                     const float* __restrict__ weights, int k, int n, float* out, long elements) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at >= elements) return;
  const long first = at / n * k;
  out[at] = weighted_row_sum(rows, weights + first, k, n, static_cast<int>(at % n),
                             [&](int j) { return static_cast<long>(row_of[first + j]); });
}

__global__ void gather_kernel(const float* __restrict__ src, const int* __restrict__ index, int n,
                              float* __restrict__ dst, long elements) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at < elements) dst[at] = src[static_cast<long>(index[at / n]) * n + at % n];
}

__global__ void slots_kernel(const int* __restrict__ slot_of, const std::int32_t* __restrict__ ids, int count,
                             int* __restrict__ slots) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at < count) slots[at] = slot_of[ids[at]];
}

// Element counts are products of a buffer's dimensions: the buffer lives in VRAM, so they fit a long with room.
unsigned blocks_for(long n) { return static_cast<unsigned>((n + kElementThreads - 1) / kElementThreads); }

}  // namespace

cudaError_t shared_expert_gate(const float* w, const float* x, float* gate, int rows, int n, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
  return launch(gate_kernel, rows, kDotThreads, 0, stream, w, x, gate, n);
}

cudaError_t swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream, const Q8Blocks& h_q8) {
  if (n <= 0 || (h_q8.xq != nullptr && n % kQ8Block != 0)) return cudaErrorInvalidValue;
  return launch(swiglu_kernel, blocks_for(n), kElementThreads, 0, stream, g, u, h, n, h_q8);
}

cudaError_t moe_combine(const float* routed, const float* shared, const float* gate, float* out, int rows, int n,
                        cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(rows) * n;
  return launch(combine_kernel, blocks_for(elements), kElementThreads, 0, stream, routed, shared, gate, out, n,
                elements);
}

cudaError_t moe_cached_sum(const float* rows, const int* slots, const float* weights, int tokens, int k, int n,
                           bool accumulate, float* out, cudaStream_t stream) {
  if (tokens <= 0 || k <= 0 || n <= 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(tokens) * n;
  return launch(cached_sum_kernel, blocks_for(elements), kElementThreads, 0, stream, rows, slots, weights, k, n,
                accumulate, out, elements);
}

cudaError_t moe_weighted_rows(const float* rows, const int* row_of, const float* weights, int tokens, int k, int n,
                              float* out, cudaStream_t stream) {
  if (tokens <= 0 || k <= 0 || n <= 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(tokens) * n;
  return launch(weighted_rows_kernel, blocks_for(elements), kElementThreads, 0, stream, rows, row_of, weights, k, n,
                out, elements);
}

cudaError_t gather_rows(const float* src, const int* index, int m, int n, float* dst, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(m) * n;
  return launch(gather_kernel, blocks_for(elements), kElementThreads, 0, stream, src, index, n, dst, elements);
}

cudaError_t cache_slots(const int* slot_of, const std::int32_t* ids, int count, int* slots, cudaStream_t stream) {
  if (count <= 0) return cudaErrorInvalidValue;
  return launch(slots_kernel, blocks_for(count), kElementThreads, 0, stream, slot_of, ids, count, slots);
}

}  // namespace strata::kernels
