// How the GEMV kernels spread rows over warps: a CTA of kRowsPerCta warps takes kRowsPerCta / split rows, each
// row read by `split` warps. Matrices of few rows (routers, low-rank mixers, k/v projections) would leave most
// SMs idle and each warp a long serial walk along its row; splitting the columns puts more loads in flight.
#pragma once

#include "reduce.cuh"

namespace strata::kernels {

constexpr int kRowsPerCta = 4;

// Warps per row (1, 2 or 4) for a matrix of `rows` rows.
inline int row_split(int rows) { return rows >= 2048 ? 1 : rows >= 1024 ? 2 : 4; }

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

}  // namespace strata::kernels
