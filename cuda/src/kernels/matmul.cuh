// Matrix products Y = X W^T over many rows of activations (the prompt path): where the GEMV (gemv.cuh) reads
// each weight once per activation row, these read each weight tile once per tile of kMatmulRowTile rows and
// multiply on tensor cores. Launchers never allocate, synchronise or throw, and need no scratch: they are
// capturable into CUDA graphs.
//
// Quantized forms take X as q8_32 (quantize_q8_32) and keep the GEMV's arithmetic: every group's inner sum
// Σ v xq is exact (int8 tensor-core products, int32 sums), then scaled and summed in float32 as
// docs/forms.md's activation contract says; only the order of the float32 sums over blocks differs from the
// GEMV's. Float forms (f32, f16, bf16 weights) take X as float32 and multiply on bf16 tensor cores with each
// operand split into a high and a low bf16 (x = hi + lo to 16 bits; f16 and bf16 weights split exactly), so
// a product loses at most about 3 * 2^-16 of |w| |x| (f32 weights; 2^-16 for bf16), not bf16's 2^-8.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/forms.hpp"

namespace strata::kernels {

constexpr int kMatmulRowTile = 64;      // X rows per CTA
constexpr int kMatmulWeightTile = 128;  // weight rows per CTA

// The rows of X and Y: row i of Y is row i of X times a weight matrix. X rows are x_stride elements apart
// (>= cols; for the quantized forms a multiple of 32, so that xq row i starts at xq + i * x_stride and its block
// scales at dx + i * x_stride / 32), Y rows y_stride floats apart (>= the matrix's rows).
struct MatmulRows {
  int count = 0;  // dense: the rows T; grouped: an upper bound on the rows the groups cover (it sizes the grid)
  int x_stride = 0;
  int y_stride = 0;
};

// Groups of rows over a stack of matrices (gemv.cuh's MatrixBatch layout: matrix m's row r is the stack's row
// m * rows + r in every plane): group g is rows begin[g] .. begin[g + 1] - 1 of X and Y, multiplied by matrix
// slots[g]; slots[g] < 0 skips the group and leaves its Y rows unwritten, as are rows no group covers. slots
// [count] and begin [count + 1] live in device memory (routing is computed on the device), with
// 0 <= begin[0] <= ... <= begin[count] <= MatmulRows::count; a group may be empty. The caller keeps slots within
// its stack.
struct MatmulGroups {
  const int* slots = nullptr;
  const int* begin = nullptr;
  int count = 0;
};

// The grid covers the worst case, so the host needs neither the routing nor a synchronisation: CTA column j of
// the grid serves group g's tile j - (begin[g] / kMatmulRowTile + g), and a group of n rows has ceil(n / tile)
// of the slots from begin[g] / tile + g up to the next group's, so `rows / tile + groups` columns cover any
// routing of `rows` rows. Columns without a tile (idle slots, empty or skipped groups) return at once.
constexpr int kMaxMatmulGridColumns = 65535;  // the tiles go along the grid's y dimension

// The most rows a launch of `groups` groups (0: dense) can take.
constexpr long matmul_max_rows(int groups) {
  return groups > 0 ? static_cast<long>(kMaxMatmulGridColumns - groups + 1) * kMatmulRowTile - 1
                    : static_cast<long>(kMaxMatmulGridColumns) * kMatmulRowTile;
}

// True when matmul_quant has a kernel for `form` (every form of docs/forms.md).
bool matmul_quant_supports(const QuantForm& form);

// Y[i][r] = Σ_c W[r][c] X[i][c] for i < x_rows.count, W rows x cols of `form` (cols a multiple of its
// super_size; codes 16-byte aligned, 8 for 2-bit codes), X as q8_32: xq [count][x_stride] (16-byte aligned),
// dx [count][x_stride / 32]. Every code must lie within its form's range (v = code - code_bias fits int8, as
// strata.quant.repack writes them). Refused with cudaErrorInvalidValue: a form none of docs/forms.md's, a bad
// size or stride, more rows than matmul_max_rows; cudaErrorMisalignedAddress: codes or xq misaligned.
cudaError_t matmul_quant(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                         const MatmulRows& x_rows, const std::int8_t* xq, const float* dx, float* y,
                         cudaStream_t stream);
cudaError_t matmul_quant_grouped(const QuantForm& form, const QuantPlanes& stack, int rows, int cols,
                                 const MatmulRows& x_rows, const MatmulGroups& groups, const std::int8_t* xq,
                                 const float* dx, float* y, cudaStream_t stream);

// The float forms: W [rows][cols] of `kind` (f32, f16 bits, bf16 bits), X float32 [count][x_stride]. Any cols;
// 16-byte vector loads when cols and x_stride are multiples of 4 and w, x aligned to 4 elements (16 bytes for x).
cudaError_t matmul_float(FloatKind kind, const void* w, int rows, int cols, const MatmulRows& x_rows,
                         const float* x, float* y, cudaStream_t stream);
cudaError_t matmul_float_grouped(FloatKind kind, const void* w_stack, int rows, int cols, const MatmulRows& x_rows,
                                 const MatmulGroups& groups, const float* x, float* y, cudaStream_t stream);

}  // namespace strata::kernels
