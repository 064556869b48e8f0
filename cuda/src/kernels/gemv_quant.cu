#include <cstdint>

#include "gemv.cuh"
#include "gemv_quant_mma.cuh"
#include "gemv_quant_rows.cuh"
#include "gemv_rows.cuh"
#include "int8_dot.cuh"
#include "launch.cuh"
#include "quant_shapes.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kBlock = kCodeBlock;

// One matrix (Batched false: gemv_quant) or a product of a batch of `count` (gemv.cuh, gemv_rows.cuh's grid),
// whose matrix starts at the stack's row slot * rows in every plane and whose x and y are offset here: the loop is
// the same for both. A warp takes R rows (each walked as the one-row walk walks it, so the same bits).
template <class S, bool Batched, int R>
__global__ void __launch_bounds__(kRowsPerCta * 32)
gemv_quant_kernel(QuantPlanes p, int rows, int cols, int code_bias, ValueTable book, const int* __restrict__ slots,
                  int x_stride, int count, const std::int8_t* __restrict__ xq, const float* __restrict__ dx,
                  const std::int32_t* __restrict__ xsums, float* __restrict__ y, int split) {
  // One matrix's rows are the model's weights; a batch's matrices are named by its producer's routing.
  prefetch_constant_rows(Batched ? nullptr : p.codes, static_cast<long>(cols / kBlock) * S::kCodeWords * 4,
                         static_cast<long>(blockIdx.x) * (kRowsPerCta / split) * R, kRowsPerCta / split * R, rows);
  await_producers();
  release_consumers();
  long first_row = 0;
  int tile = static_cast<int>(blockIdx.x);
  if constexpr (Batched) {
    const int product = batch_product(count);
    tile = row_tile(count);
    const int slot = batch_slot(slots, product);
    if (slot < 0) return;
    first_row = static_cast<long>(slot) * rows;
    const long x_offset = static_cast<long>(product) * x_stride;
    xq = advanced(xq, x_offset);
    dx = advanced(dx, x_offset / kBlock);
    xsums = advanced(xsums, x_offset / kBlock);
    y += static_cast<long>(product) * rows;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row_in_range = (tile * (kRowsPerCta / split) + warp / split) * R;
  const bool live = row_in_range < rows;
  const GlobalQ8 x{xq, dx, xsums};
  if constexpr (R == 1) {
    // The row in the stack; a spare warp walks no blocks but joins the CTA's reduction.
    const long row = first_row + (live ? row_in_range : rows - 1);
    float acc = quant_row_partial<S>(p, row, live, cols, code_bias, book, x, warp % split * 32 + lane, 32 * split);
    acc = warp_sum(acc);
    store_row(acc, row_in_range, rows, warp, lane, split, y);
  } else {
    long row[R];  // rows past the matrix repeat its last: walked, never stored
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = first_row + (row_in_range + r < rows ? row_in_range + r : rows - 1);
    float acc[R][1];
    quant_rows_partials<S, 1, R>(p, row, live, cols, code_bias, book, OneQ8<GlobalQ8>{x}, 1, warp % split * 32 + lane,
                                 32 * split, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = warp_sum(acc[r][0]);
    store_rows(acc, 1, row_in_range, rows, warp, lane, split, y);
  }
}

// Rows a warp of a batch takes where a row is shorter than a warp's lanes' blocks (cols < 32 x 32) and one warp
// reads it: the routed experts' down matrices (640 columns: 20 blocks for 32 lanes) ran at a third of HBM's rate
// with a warp a row, each lane one block in flight (bench_gemv_batch, H100, 2026-12-06); 4 rows put 4 in flight.
constexpr int kShortRowsPerWarp = 4;

inline int batch_warp_rows(const MatrixBatch& batch, int cols, int split) {
  return batch.slots != nullptr && split == 1 && cols / kBlock < 32 ? kShortRowsPerWarp : 1;
}

// One matrix times `inputs` (<= N) activations (gemv_quant_inputs): the one-matrix walk of gemv_quant_kernel over
// R rows a warp, each weight block decoded once for every input and each input block loaded once for the R rows. N
// is a compile-time bound on the inputs, so that a kernel for few of them holds no accumulators for more
// (measured: one of 8 for 2 inputs ran a wide matrix 5-25 % slower than 2 products).
template <class S, int N, int R>
__global__ void __launch_bounds__(kRowsPerCta * 32)
gemv_quant_inputs_kernel(QuantPlanes p, int rows, int cols, int code_bias, ValueTable book, StridedQ8 acts,
                         int inputs, float* __restrict__ y, int split) {
  prefetch_constant_rows(p.codes, static_cast<long>(cols / kBlock) * S::kCodeWords * 4,
                         static_cast<long>(blockIdx.x) * (kRowsPerCta / split) * R, kRowsPerCta / split * R, rows);
  await_producers();
  release_consumers();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first_row = (static_cast<int>(blockIdx.x) * (kRowsPerCta / split) + warp / split) * R;
  const bool live = first_row < rows;
  long row[R];  // rows past the matrix repeat its last: walked, never stored
#pragma unroll
  for (int r = 0; r < R; ++r) row[r] = first_row + r < rows ? first_row + r : rows - 1;
  float acc[R][N];
  quant_rows_partials<S, N, R>(p, row, live, cols, code_bias, book, acts, inputs, warp % split * 32 + lane,
                               32 * split, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i < inputs) acc[r][i] = warp_sum(acc[r][i]);
    }
  }
  store_rows(acc, inputs, first_row, rows, warp, lane, split, y);
}

// Rows a warp takes for a bound of N inputs on a tall matrix: at 8 inputs a lane's loads of the inputs' codes for
// each weight block of one row came near L1's rate (the multi-input GEMV of 8 rows took qkvz 2.4x the single GEMV on
// the H100); 4 rows divide them by 4 (qkvz at 8 inputs 41.9 -> 32.5 us, the LM head 502 -> 322 us), 2 rows at 2
// inputs keep the warps many.
template <int N>
constexpr int kWarpRows = N >= 4 ? 4 : 2;

// Below this many rows a matrix keeps a warp a row: 4 rows a warp left the 2560-row matrices too few warps to fill
// the GPU (ssm_out at 4 inputs 11.7 -> 12.7 us, the shared expert's down 5.6 -> 7.3 us at 8) and the 640-row ones
// a warp per SM (2x slower) (bench_gemv_inputs.py, H100, 2026-12-06).
constexpr int kTallRows = 8192;

// The multi-input kernel of the fewest accumulators for `inputs` (2..kMaxGemvInputs), for a tall matrix or not.
template <class S, bool Tall>
auto* inputs_kernel(int inputs) {
  static_assert(kMaxGemvInputs == 8, "one kernel per bound 2, 4, 8");
  return inputs <= 2   ? gemv_quant_inputs_kernel<S, 2, Tall ? kWarpRows<2> : 1>
         : inputs <= 4 ? gemv_quant_inputs_kernel<S, 4, Tall ? kWarpRows<4> : 1>
                       : gemv_quant_inputs_kernel<S, 8, Tall ? kWarpRows<8> : 1>;
}

// Rows a warp of inputs_kernel takes for `inputs` on a matrix of `rows` rows.
inline int warp_rows(int rows, int inputs) {
  if (rows < kTallRows) return 1;
  return inputs <= 2 ? kWarpRows<2> : inputs <= 4 ? kWarpRows<4> : kWarpRows<8>;
}

// The single matrix's kernel when the batch is one product of matrix 0, so gemv_quant pays nothing for batches.
template <class S>
cudaError_t launch_shape(dim3 grid, cudaStream_t stream, const QuantPlanes& planes, int rows, int cols, int code_bias,
                         const ValueTable& book, const MatrixBatch& batch, const std::int8_t* xq, const float* dx,
                         const std::int32_t* xsums, float* y, int split) {
  auto* kernel = gemv_quant_kernel<S, false, 1>;
  if (batch.slots != nullptr) {
    kernel = batch_warp_rows(batch, cols, split) == 1 ? gemv_quant_kernel<S, true, 1>
                                                      : gemv_quant_kernel<S, true, kShortRowsPerWarp>;
  }
  return launch(kernel, grid, kRowsPerCta * 32, 0, stream, planes, rows, cols, code_bias, book, batch.slots,
                batch.x_stride, batch.count, xq, dx, xsums, y, split);
}

// Launches the kernel of the shape `form` matches; cudaErrorInvalidValue if it matches none.
cudaError_t launch_form(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, const MatrixBatch& batch,
                        const std::int8_t* xq, const float* dx, const std::int32_t* xsums, float* y,
                        cudaStream_t stream) {
  const int split = batch_split(batch, rows), per_warp = batch_warp_rows(batch, cols, split);
  const dim3 grid = gemv_grid((rows + per_warp - 1) / per_warp, split, batch.count);  // a warp takes per_warp rows
  if (grid.x == 0) return cudaErrorInvalidValue;
  const ValueTable book = value_table(codebook_values(form.codebook));
  cudaError_t status = cudaErrorInvalidValue;
  KnownShapes::visit(form, [&](auto shape) {
    status = launch_shape<decltype(shape)>(grid, stream, planes, rows, cols, form.code_bias, book, batch, xq, dx,
                                           xsums, y, split);
  });
  return status;
}

}  // namespace

bool gemv_quant_supports(const QuantForm& form) { return KnownShapes::contains(form); }

cudaError_t gemv_quant_operands(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                                const std::int8_t* xq) {
  if (rows <= 0 || cols <= 0 || form.super_size <= 0 || cols % form.super_size != 0) return cudaErrorInvalidValue;
  const unsigned alignment = form.code_bits == 2 ? 8u : 16u;
  if (reinterpret_cast<std::uintptr_t>(planes.codes) % alignment != 0 ||
      reinterpret_cast<std::uintptr_t>(xq) % 16 != 0) {
    return cudaErrorMisalignedAddress;
  }
  return KnownShapes::contains(form) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t gemv_quant_batch(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                             const MatrixBatch& batch, const std::int8_t* xq, const float* dx,
                             const std::int32_t* xsums, float* y, cudaStream_t stream) {
  const cudaError_t operands = gemv_quant_operands(form, planes, rows, cols, xq);
  if (operands != cudaSuccess) return operands;
  if (!valid_batch(batch) || batch.x_stride % kBlock != 0) return cudaErrorInvalidValue;
  return launch_form(form, planes, rows, cols, batch, xq, dx, xsums, y, stream);
}

cudaError_t gemv_quant_inputs(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                              int x_stride, const std::int8_t* xq, const float* dx, const std::int32_t* xsums,
                              float* y, cudaStream_t stream, InputsKernel kernel) {
  const cudaError_t operands = gemv_quant_operands(form, planes, rows, cols, xq);
  if (operands != cudaSuccess) return operands;
  const bool inputs_ok = inputs >= 1 && inputs <= gemv_quant_max_inputs(form, rows, cols, kernel);
  if (!inputs_ok || x_stride < cols || x_stride % kBlock != 0) return cudaErrorInvalidValue;
  const bool tensor_cores = kernel == InputsKernel::kTensorCores ||
                            (kernel == InputsKernel::kChosen && inputs >= kMmaMinInputs &&
                             gemv_quant_mma_runs(form, rows, cols) && gemv_quant_mma_aligned(planes));
  const StridedQ8 acts{xq, dx, xsums, x_stride};
  if (tensor_cores) return gemv_quant_mma(form, planes, rows, cols, inputs, acts, y, stream);
  if (inputs == 1) return gemv_quant(form, planes, rows, cols, xq, dx, xsums, y, stream);  // the same walk, lighter
  const int split = row_split(rows), per_warp = warp_rows(rows, inputs);
  const dim3 grid = gemv_grid((rows + per_warp - 1) / per_warp, split, 1);  // a CTA's warps take R rows each
  if (grid.x == 0) return cudaErrorInvalidValue;
  const ValueTable book = value_table(codebook_values(form.codebook));
  cudaError_t status = cudaErrorInvalidValue;
  KnownShapes::visit(form, [&](auto shape) {
    using S = decltype(shape);
    auto* kernel = per_warp == 1 ? inputs_kernel<S, false>(inputs) : inputs_kernel<S, true>(inputs);
    status = launch(kernel, grid, kRowsPerCta * 32, 0, stream, planes, rows, cols, form.code_bias, book, acts, inputs,
                    y, split);
  });
  return status;
}

int gemv_quant_max_inputs(const QuantForm& form, int rows, int cols, InputsKernel kernel) {
  if (kernel == InputsKernel::kInteger) return kMaxGemvInputs;
  if (kernel == InputsKernel::kTensorCores) return kMaxMmaInputs;
  // the tensor cores above kMaxGemvInputs
  return gemv_quant_mma_runs(form, rows, cols) ? kMaxMmaInputs : kMaxGemvInputs;
}

cudaError_t gemv_quant(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                       const std::int8_t* xq, const float* dx, const std::int32_t* xsums, float* y,
                       cudaStream_t stream) {
  return gemv_quant_batch(form, planes, rows, cols, MatrixBatch{nullptr, 1, 0}, xq, dx, xsums, y, stream);
}

}  // namespace strata::kernels
