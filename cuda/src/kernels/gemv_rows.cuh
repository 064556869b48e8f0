// How the GEMV kernels spread rows over warps: a CTA of kRowsPerCta warps takes kRowsPerCta / split rows, each
// row read by `split` warps. Matrices of few rows (routers, low-rank mixers, k/v projections) would leave most
// SMs idle and each warp a long serial walk along its row; splitting the columns puts more loads in flight.
#pragma once

#include <cstdint>

#include "gemv.cuh"
#include "reduce.cuh"

namespace strata::kernels {

constexpr int kRowsPerCta = 4;

// CTAs over a batch's products and one matrix's row tiles, in the grid's x dimension with the product fastest:
// CTA i serves product i % count at row tile i / count. A tile's CTAs for every product then run side by side,
// so products of one matrix (a batch of rows of x: a prompt chunk's, a verification step's, a batched step's)
// read each tile from HBM once and from L2 for the others, where product-major CTAs would stream the whole matrix
// once per product. x is 0 where the CTAs would pass the dimension's limit (the launchers refuse it).
inline dim3 gemv_grid(int rows, int split, int count) {
  const int rows_per_cta = kRowsPerCta / split;
  const long ctas = static_cast<long>((rows + rows_per_cta - 1) / rows_per_cta) * count;
  return dim3(ctas <= 0x7fffffffL ? static_cast<unsigned>(ctas) : 0u);
}

// This CTA's product of the batch's `count` and its row tile (gemv_grid).
__device__ __forceinline__ int batch_product(int count) { return static_cast<int>(blockIdx.x % count); }
__device__ __forceinline__ int row_tile(int count) { return static_cast<int>(blockIdx.x / count); }

// The batch conditions both GEMV families share (gemv.cuh); the quantized forms add x_stride % 32 == 0.
inline bool valid_batch(const MatrixBatch& batch) {
  return batch.count >= 1 && batch.count <= kMaxBatchProducts && (batch.slots != nullptr || batch.count == 1) &&
         batch.x_stride >= 0 && (batch.split == 0 || batch.split == 1 || batch.split == 2 || batch.split == 4);
}

// The warps per row of a batch's products: its own choice, else the rule.
inline int batch_split(const MatrixBatch& batch, int rows) { return batch.split ? batch.split : row_split(rows); }

// The matrix of product `product`, < 0 when the batch skips it. Every thread of the CTA reads the same slot, so
// a skipped product's CTA returns as a whole and none waits at store_row's barrier.
__device__ __forceinline__ int batch_slot(const int* __restrict__ slots, int product) { return slots[product]; }

// p + n elements, through an integer: nvcc would fold a product's offset into the index of every load of the
// GEMV loops (64-bit adds per load); this way the loops index the offset pointer as they index a parameter.
// Only for pointers read through __ldg: the integer loses the pointer's provenance, so a plain load of it would
// become a generic one.
template <class T>
__device__ __forceinline__ const T* advanced(const T* p, long n) {
  return reinterpret_cast<const T*>(reinterpret_cast<std::uintptr_t>(p) + n * static_cast<long>(sizeof(T)));
}

// Sums the warps' partial dots of each row (`acc` already warp-reduced) and stores them; every thread calls it.
__device__ __forceinline__ void store_row(float acc, int row, int rows, int warp, int lane, int split, float* y) {
  if (split == 1) {
    if (lane == 0 && row < rows) y[row] = acc;
    return;
  }
  __shared__ float partial[kRowsPerCta];
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (lane == 0 && warp % split == 0 && row < rows) {
    float sum = 0.0f;
    for (int p = 0; p < split; ++p) sum += partial[warp + p];
    y[row] = sum;
  }
}

// store_row for the R rows first_row .. first_row + R - 1 of a multi-input GEMV's warp, the first `inputs` of each
// row's kInputs sums (each already warp-reduced): input i's row into y + i * rows.
template <int R, int kInputs>
__device__ __forceinline__ void store_rows(const float (&acc)[R][kInputs], int inputs, int first_row, int rows,
                                           int warp, int lane, int split, float* y) {
  if (split == 1) {
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        if (i < inputs && first_row + r < rows) y[static_cast<long>(i) * rows + first_row + r] = acc[r][i];
      }
    }
    return;
  }
  __shared__ float partial[R][kInputs][kRowsPerCta];
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < kInputs; ++i) partial[r][i][warp] = acc[r][i];
    }
  }
  __syncthreads();
  if (lane != 0 || warp % split != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < kInputs; ++i) {
      if (i >= inputs || first_row + r >= rows) break;
      float sum = 0.0f;
      for (int p = 0; p < split; ++p) sum += partial[r][i][warp + p];
      y[static_cast<long>(i) * rows + first_row + r] = sum;
    }
  }
}

}  // namespace strata::kernels
