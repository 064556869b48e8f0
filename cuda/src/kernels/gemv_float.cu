#include <cstdint>

#include "gemv.cuh"
#include "gemv_float_rows.cuh"
#include "gemv_rows.cuh"
#include "launch.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

// One matrix (Batched false: gemv_float) or a product of a batch of `count` (gemv.cuh, gemv_rows.cuh's grid),
// whose matrix, x and y are offset here: the loop is the same for both.
template <class T, int Vec, bool Batched>
__global__ void __launch_bounds__(kRowsPerCta * 32)
gemv_float_kernel(const T* __restrict__ w, int rows, int cols, const int* __restrict__ slots, int x_stride,
                  int count, const float* __restrict__ x, float* __restrict__ y, int split) {
  prefetch_constant_rows(Batched ? nullptr : w, static_cast<long>(cols) * sizeof(T),
                         static_cast<long>(blockIdx.x) * (kRowsPerCta / split), kRowsPerCta / split, rows);
  await_producers();
  release_consumers();
  int tile = static_cast<int>(blockIdx.x);
  if constexpr (Batched) {
    const int product = batch_product(count);
    tile = row_tile(count);
    const int slot = batch_slot(slots, product);
    if (slot < 0) return;
    w += static_cast<long>(slot) * rows * cols;  // not advanced(): the weights keep their read-only loads
    x = advanced(x, static_cast<long>(product) * x_stride);
    y += static_cast<long>(product) * rows;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = tile * (kRowsPerCta / split) + warp / split;
  float acc = 0.0f;
  if (row < rows) {
    acc = float_row_partial<T, Vec>(w + static_cast<long>(row) * cols, cols, GlobalF32{x}, warp % split * 32 + lane,
                                    32 * split);
  }
  acc = warp_sum(acc);
  store_row(acc, row, rows, warp, lane, split, y);
}

// y_i = W x_i for i < inputs (1..N): one warp (or `split` warps) a row as gemv_float_kernel, every input's dot
// from the same loads of the row, each the bits of gemv_float's (float_row_partials, then the same reduction).
template <class T, int Vec, int N>
__global__ void __launch_bounds__(kRowsPerCta * 32)
gemv_float_inputs_kernel(const T* __restrict__ w, int rows, int cols, int x_stride, int inputs,
                         const float* __restrict__ x, float* __restrict__ y, int split) {
  prefetch_constant_rows(w, static_cast<long>(cols) * sizeof(T), static_cast<long>(blockIdx.x) * (kRowsPerCta / split),
                         kRowsPerCta / split, rows);
  await_producers();
  release_consumers();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = static_cast<int>(blockIdx.x) * (kRowsPerCta / split) + warp / split;
  float acc[1][N];
  if (row < rows) {
    float_row_partials<T, Vec, N>(w + static_cast<long>(row) * cols, cols, x, x_stride, inputs,
                                  warp % split * 32 + lane, 32 * split, acc[0]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[0][j] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) acc[0][j] = warp_sum(acc[0][j]);
  store_rows<1, N>(acc, inputs, row, rows, warp, lane, split, y);
}

template <class T, int Vec>
auto* inputs_kernel(int inputs) {
  static_assert(kMaxFloatInputs == 16, "kernels for 2, 4, 8 and 16 inputs");
  return inputs <= 2   ? gemv_float_inputs_kernel<T, Vec, 2>
         : inputs <= 4 ? gemv_float_inputs_kernel<T, Vec, 4>
         : inputs <= 8 ? gemv_float_inputs_kernel<T, Vec, 8>
                       : gemv_float_inputs_kernel<T, Vec, 16>;
}

}  // namespace

cudaError_t gemv_float_inputs(FloatKind kind, const void* w, int rows, int cols, int inputs, int x_stride,
                              const float* x, float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || inputs < 1 || inputs > kMaxFloatInputs || x_stride < cols) {
    return cudaErrorInvalidValue;
  }
  if (inputs == 1) return gemv_float(kind, w, rows, cols, x, y, stream);  // the same loop, one input
  const int split = row_split(rows);
  const dim3 grid = gemv_grid(rows, split, 1);
  if (grid.x == 0) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  const bool known = visit_float_rows(kind, w, cols, x_stride, x, [&](auto path) {
    using P = decltype(path);
    using T = typename P::Element;
    status = launch(inputs_kernel<T, P::kVec>(inputs), grid, kRowsPerCta * 32, 0, stream, static_cast<const T*>(w),
                    rows, cols, x_stride, inputs, x, y, split);
  });
  return known ? status : cudaErrorInvalidValue;
}

cudaError_t gemv_float_batch(FloatKind kind, const void* w, int rows, int cols, const MatrixBatch& batch,
                             const float* x, float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || !valid_batch(batch)) return cudaErrorInvalidValue;
  const int split = batch_split(batch, rows);
  const dim3 grid = gemv_grid(rows, split, batch.count);
  if (grid.x == 0) return cudaErrorInvalidValue;
  // The single matrix's kernel when the batch is one product of matrix 0, so gemv_float pays nothing for batches.
  cudaError_t status = cudaSuccess;
  const bool known = visit_float_rows(kind, w, cols, batch.x_stride, x, [&](auto path) {
    using P = decltype(path);
    using T = typename P::Element;
    auto* kernel = batch.slots != nullptr ? gemv_float_kernel<T, P::kVec, true> : gemv_float_kernel<T, P::kVec, false>;
    status = launch(kernel, grid, kRowsPerCta * 32, 0, stream, static_cast<const T*>(w), rows, cols, batch.slots,
                    batch.x_stride, batch.count, x, y, split);
  });
  return known ? status : cudaErrorInvalidValue;
}

cudaError_t gemv_float(FloatKind kind, const void* w, int rows, int cols, const float* x, float* y,
                       cudaStream_t stream) {
  return gemv_float_batch(kind, w, rows, cols, MatrixBatch{nullptr, 1, 0}, x, y, stream);
}

}  // namespace strata::kernels
