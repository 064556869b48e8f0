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

}  // namespace

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
