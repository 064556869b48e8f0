// The AVX-512 row kernels' own source with vpdpbusd emulated (vnni_emulated.cpp): for pool_check only.
#pragma once

#include "../cpu/dot.hpp"

namespace strata::pool_check {

// row_dot.inl over int_dot_vnni.inl's IntDot, built for AVX2 with vpdpbusd done lane by lane in C++: the AVX-512
// kernel for `form`, runnable on any AVX2 CPU (slowly). Quantized forms only.
cpu::RowsKernel emulated_vnni_kernel(const QuantForm& form);

}  // namespace strata::pool_check
