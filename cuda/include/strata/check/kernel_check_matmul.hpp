// Host round trips of the matrix products (kernels/matmul.cuh), so Python tests can check them against the
// GEMV run once per row and the numpy reference, and their timing for benchmarks/bench_matmul.py. Each call
// uploads its inputs, runs the product into a poisoned, guarded output and copies it back. Not for the token
// path: these allocate and synchronise. Host-only header (no CUDA types).
#pragma once

#include <cstdint>

#include "strata/forms.hpp"

namespace strata::kernel_check {

// The rows of one product: x [count][x_stride] and y [count][y_stride] (host), dense (groups 0: every row
// times matrix 0 of the stack) or in groups (slots [groups], begin [groups + 1], host arrays; matmul.cuh's
// MatmulGroups).
struct MatmulCheckRows {
  int count = 0;
  int x_stride = 0;  // >= cols; a multiple of 32 for the quantized forms
  int y_stride = 0;  // >= rows
  const std::int32_t* slots = nullptr;
  const std::int32_t* begin = nullptr;
  int groups = 0;
};

// y = the rows of x times the matrices of a host stack of n_matrix matrices of rows x cols (host_stack holds
// n_matrix * rows rows; w_stack [n_matrix * rows][cols] of `kind`). The quantized forms take x quantized to
// q8_32 on the device (one quantize_q8_32 over count * x_stride floats). Whatever the product must not write
// (the gaps past `rows` in each y row, rows of no group or of a skipped group) comes back as the poison, NaN.
// Arguments are checked before any device work: sizes and strides, every slot against the stack, begin.
void matmul_quant(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                  int cols, const MatmulCheckRows& x_rows, const float* x, float* y);
void matmul_float(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                  const MatmulCheckRows& x_rows, const float* x, float* y);

// Median seconds of one product over `count` rows (x_stride = cols, y_stride = rows, x of small constant
// values): dense with groups 0, else `groups` equal groups of count / groups rows (count a multiple of groups),
// group g times matrix g % n_matrix. The L2 stays warm: a product re-reads each weight tile per tile of rows.
double time_matmul_quant(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                         int cols, int count, int groups, int reps);
double time_matmul_float(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                         int count, int groups, int reps);

}  // namespace strata::kernel_check
