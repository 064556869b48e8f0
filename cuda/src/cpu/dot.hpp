// The row-dot kernels: y[r] = scale * (W[r] . x) for a row range of one expert's matrix, x in q8_32.
#pragma once

#include <cstdint>

#include "activation.hpp"
#include "strata/expert_pool.hpp"

namespace strata::cpu {

// Longest row the kernels take: their per-row scale buffer lives on the stack.
constexpr int64_t kMaxCols = 16384;

// How a form's codes become integers: 2-bit, 4-bit, 4-bit through a 16-entry codebook, 8-bit.
enum class CodeKind { k2, k4, k4Codebook, k8 };

// One expert's matrix: pointers to its row 0 in every plane.
struct MatrixRows {
  const QuantForm* form = nullptr;
  int64_t cols = 0;
  const uint8_t* codes = nullptr;
  const uint8_t* d = nullptr;  // float16 or float32 values
  const int8_t* sub_scales = nullptr;
  const uint16_t* mins = nullptr;  // float16 bits
  const uint8_t* sub_mins = nullptr;
};

using RowsKernel = void (*)(const MatrixRows& m, int64_t row0, int64_t row1, const QuantizedVector& x, float scale,
                            float* y);

// Kernel for `form` on each ISA (defined in dot_avx2.cpp / dot_avx512.cpp, compiled with their ISA flags).
RowsKernel rows_kernel_avx2(const QuantForm& form);
RowsKernel rows_kernel_avx512(const QuantForm& form);

// The kernel for `form` on a resolved `isa` (kAvx2 or kAvx512).
inline RowsKernel rows_kernel(Isa isa, const QuantForm& form) {
  return isa == Isa::kAvx512 ? rows_kernel_avx512(form) : rows_kernel_avx2(form);
}

}  // namespace strata::cpu
