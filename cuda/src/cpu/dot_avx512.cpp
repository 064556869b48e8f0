// Row-dot kernels for AVX-512 VNNI: row_dot.inl over int_dot_vnni.inl's IntDot, compiled with the ISA's flags.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "dot.hpp"

namespace strata::cpu {
namespace {

#include "code_unpack.inl"
#include "int_dot_vnni.inl"
#include "row_dot.inl"

}  // namespace

RowsKernel rows_kernel_avx512(const QuantForm& form) { return pick_kernel(form); }

}  // namespace strata::cpu
