// The row-dot kernels: y[r] = scale * (W[r] . x) for a row range of one expert's matrix: the quantized
// family (x in q8_32: dot_avx2.cpp, dot_avx512.cpp) and the float family (x in float32: float_dot_*.cpp).
#pragma once

#include <cstdint>

#include "activation.hpp"
#include "strata/expert_pool.hpp"

namespace strata::cpu {

// Longest row the kernels take: their per-row scale buffer lives on the stack.
constexpr int64_t kMaxCols = 16384;

// How far ahead of the bytes it reads every row kernel prefetches.
constexpr int64_t kPrefetchAhead = 4096;

// How a form's codes become integers: 2-bit, 4-bit, 4-bit through a 16-entry codebook, 8-bit below 128 (every
// widened form: Q5_*, Q6_K, Q3_K), 8-bit over the whole byte (Q8_0: v + 128), which AVX2's maddubs cannot take
// unsigned (its int16 pairs would saturate).
enum class CodeKind { k2, k4, k4Codebook, k8, k8Wide };

// One expert's matrix: pointers to its row 0 in every plane.
struct MatrixRows {
  const QuantForm* form = nullptr;  // quantized forms only
  int64_t cols = 0;
  const uint8_t* codes = nullptr;  // or a float form's elements
  const uint8_t* d = nullptr;  // float16 or float32 values
  const int8_t* sub_scales = nullptr;
  const uint16_t* mins = nullptr;  // float16 bits
  const uint8_t* sub_mins = nullptr;
};

using RowsKernel = void (*)(const MatrixRows& m, int64_t row0, int64_t row1, const Activation& x, float scale,
                            float* y);

// Kernel for `form` on each ISA (defined in dot_avx2.cpp / dot_avx512.cpp, compiled with their ISA flags).
RowsKernel rows_kernel_avx2(const QuantForm& form);
RowsKernel rows_kernel_avx512(const QuantForm& form);
// Kernel for float elements of `kind` on each ISA (float_dot_avx2.cpp / float_dot_avx512.cpp).
RowsKernel float_rows_kernel_avx2(FloatKind kind);
RowsKernel float_rows_kernel_avx512(FloatKind kind);

// The kernel for `form` on a resolved `isa` (kAvx2 or kAvx512).
inline RowsKernel rows_kernel(Isa isa, const QuantForm& form) {
  return isa == Isa::kAvx512 ? rows_kernel_avx512(form) : rows_kernel_avx2(form);
}

// The kernel for float elements of `kind` on a resolved `isa`.
inline RowsKernel float_rows_kernel(Isa isa, FloatKind kind) {
  return isa == Isa::kAvx512 ? float_rows_kernel_avx512(kind) : float_rows_kernel_avx2(kind);
}

}  // namespace strata::cpu
