// The orthonormal Walsh-Hadamard rotation of the 4-bit KV halves (docs/architecture.md, "KV formats"). A head
// row is cut into blocks of n = kv_rotation_width(head_dim) elements and each block x becomes H x / sqrt(n),
// H the Sylvester Hadamard matrix of order n (natural order). The rotation spreads every element's share of
// the row over the whole block, so an outlier no longer sets a 32-group's scale alone: 4-bit codes then fit
// the row's energy, not its largest element. Being orthonormal and symmetric it is its own inverse and keeps
// dot products: attention scores q.k = (Hq).(Hk) and outputs sum_t p_t H v_t = H sum_t p_t v_t, so attention
// runs in the rotated basis once q is rotated and rotates its output back (kv.cuh).
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

constexpr int kKvRotationMax = 256;

// min(256, the largest power of two dividing head_dim): one 256-wide block per 256 elements where head_dim
// is a multiple of 256, the whole row for a power of two below it, and otherwise the widest power-of-two
// blocks that tile the row (head_dim 96: three of 32, 192: three of 64). head_dim is a multiple of 32, so
// every block holds at least one whole 32-group.
__host__ __device__ constexpr int kv_rotation_width(int head_dim) {
  return (head_dim & -head_dim) < kKvRotationMax ? (head_dim & -head_dim) : kKvRotationMax;
}

// Rotates rows[r][0:d] for r < n_rows in place. rows is shared memory, complete before the call and complete
// on return; every thread of the block calls it. The butterflies add and subtract in float32 and the scale
// 1 / sqrtf(n) is applied last (strata.reference.kv_formats.rotate repeats this order exactly); each element
// sees the same operations however the rows are spread over the threads.
__device__ __forceinline__ void kv_rotate_rows_in_place(float* rows, int n_rows, int d) {
  const int n = kv_rotation_width(d), pairs = d / 2;
  for (int h = 1; h < n; h <<= 1) {
    for (int e = threadIdx.x; e < n_rows * pairs; e += blockDim.x) {
      float* row = rows + (e / pairs) * d;
      const int p = e % pairs;
      const int a = ((p & ~(h - 1)) << 1) | (p & (h - 1));  // the p-th index whose bit h is clear
      const float x = row[a], y = row[a + h];
      row[a] = x + y;
      row[a + h] = x - y;
    }
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(n));
  for (int i = threadIdx.x; i < n_rows * d; i += blockDim.x) rows[i] *= scale;
  __syncthreads();
}

// One row: row[0:d], as kv_rotate_rows_in_place.
__device__ __forceinline__ void kv_rotate_row(float* row, int d) { kv_rotate_rows_in_place(row, 1, d); }

// out[r] = the rotation of in[r] for rows [rows][head_dim] (head_dim a multiple of 32): the rotation alone,
// for the checks. Never allocates, synchronises or throws.
cudaError_t kv_rotate(const float* in, float* out, int rows, int head_dim, cudaStream_t stream);

}  // namespace strata::kernels
