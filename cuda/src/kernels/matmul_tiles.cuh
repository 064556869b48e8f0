// What the matmul kernels (matmul_quant.cu, matmul_float.cu) share: the CTA's tile and warp layout, which rows of
// X a CTA serves (dense or grouped, matmul.cuh) and the store of a warp's outputs (the instructions: tensor_core.cuh).
//
// A CTA of 8 warps computes kMatmulWeightTile weight rows by kMatmulRowTile X rows; the warps stand 4 (weight
// rows) by 2 (X rows), each computing 32 x 32 outputs as 2 x 4 mma tiles of 16 weight rows (the mma's M) by
// 8 X rows (its N). In an mma tile, lane = 4 g + t holds the outputs of weight rows g and g + 8 and X rows
// 2 t and 2 t + 1 (PTX ISA, "Matrix Fragments for mma.m16n8k*"): element e of its accumulator is weight row
// g + 8 (e / 2), X row 2 t + e % 2.
#pragma once

#include <cuda_runtime.h>

#include "matmul.cuh"
#include "tensor_core.cuh"

namespace strata::kernels {

constexpr int kMatmulThreads = 256;
constexpr int kWarpsAlongWeights = 4;
constexpr int kMmaWeightTiles = 2;  // 16-row mma tiles per warp along the weight rows
constexpr int kMmaRowTiles = 4;     // 8-row mma tiles per warp along the X rows
static_assert(kWarpsAlongWeights * kMmaWeightTiles * 16 == kMatmulWeightTile, "warps cover the weight rows");
static_assert(kMatmulThreads / 32 / kWarpsAlongWeights * kMmaRowTiles * 8 == kMatmulRowTile, "warps cover X rows");

using WarpAccumulator = float[kMmaWeightTiles][kMmaRowTiles][4];

// The X (and Y) rows of one CTA and the matrix they multiply; count 0: the CTA has nothing to do.
struct RowTile {
  int first = 0;
  int count = 0;
  long matrix_row = 0;  // the matrix's first row in the stack
};

// This CTA's rows (blockIdx.y): the dense tile blockIdx.y, or the grouped slot of matmul.cuh's grid, found by
// every thread testing one group per pass. Every thread of the CTA calls it and gets the same tile.
__device__ __forceinline__ RowTile find_row_tile(const MatmulRows& x_rows, const MatmulGroups& groups, int rows) {
  const int slot = static_cast<int>(blockIdx.y);
  RowTile tile;
  if (groups.begin == nullptr) {
    tile.first = slot * kMatmulRowTile;
    tile.count = min(kMatmulRowTile, x_rows.count - tile.first);
    return tile;
  }
  __shared__ int found;
  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  for (int base = 0; base < groups.count; base += blockDim.x) {
    const int g = base + static_cast<int>(threadIdx.x);
    // Group g's slots are [begin[g] / tile + g, begin[g + 1] / tile + g + 1): consecutive, disjoint intervals,
    // so exactly one group holds any slot below the last group's end.
    if (g < groups.count && slot >= groups.begin[g] / kMatmulRowTile + g &&
        slot < groups.begin[g + 1] / kMatmulRowTile + g + 1) {
      found = g;
    }
  }
  __syncthreads();
  const int g = found;
  if (g < 0) return tile;
  const int first = groups.begin[g] + (slot - groups.begin[g] / kMatmulRowTile - g) * kMatmulRowTile;
  const int matrix = groups.slots[g];
  if (matrix < 0) return tile;
  tile.first = first;
  tile.count = min(kMatmulRowTile, groups.begin[g + 1] - first);  // <= 0 for a slot past the group's rows
  tile.matrix_row = static_cast<long>(matrix) * rows;
  return tile;
}

// The arguments both kernel families check the same way, the row limit of matmul_max_rows included.
inline bool valid_rows(int rows, int cols, const MatmulRows& x_rows, const MatmulGroups* groups) {
  const int groups_count = groups != nullptr ? groups->count : 0;
  return rows > 0 && cols > 0 && x_rows.count > 0 && x_rows.count <= matmul_max_rows(groups_count) &&
         x_rows.x_stride >= cols && x_rows.y_stride >= rows &&
         (groups == nullptr || (groups->count > 0 && groups->slots != nullptr && groups->begin != nullptr));
}

// The grid of a valid launch: weight row tiles along x, matmul.cuh's columns along y.
inline dim3 matmul_grid(int rows, const MatmulRows& x_rows, const MatmulGroups* groups) {
  const int columns = groups != nullptr ? x_rows.count / kMatmulRowTile + groups->count
                                        : (x_rows.count + kMatmulRowTile - 1) / kMatmulRowTile;
  return dim3(static_cast<unsigned>((rows + kMatmulWeightTile - 1) / kMatmulWeightTile),
              static_cast<unsigned>(columns));
}

// Stores a warp's outputs: weight rows from w0 (of `rows`), X rows from x0 within the tile.
__device__ __forceinline__ void store_outputs(const WarpAccumulator& acc, int w0, int x0, int rows,
                                              const RowTile& tile, int y_stride, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < kMmaWeightTiles; ++i) {
#pragma unroll
    for (int j = 0; j < kMmaRowTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = w0 + 16 * i + g + 8 * (e / 2);
        const int x_row = x0 + 8 * j + 2 * t + e % 2;
        if (row < rows && x_row < tile.count) y[static_cast<long>(tile.first + x_row) * y_stride + row] = acc[i][j][e];
      }
    }
  }
}

}  // namespace strata::kernels
