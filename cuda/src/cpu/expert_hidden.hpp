// The gate/up half of one expert's product, h = silu(gate x) * up x, over a row range: the layer job's code,
// shared with the check library so that what it reports is the job's h bit for bit.
#pragma once

#include <cstdint>

#include "dot.hpp"

namespace strata::cpu {

// h[r - r0] = silu(gate_r . x) * (up_r . x) for rows [r0, r1) of one expert's gate and up matrices.
void expert_hidden(RowsKernel gate_kernel, const MatrixRows& gate, RowsKernel up_kernel, const MatrixRows& up,
                   int64_t r0, int64_t r1, const Activation& x, float* h);

}  // namespace strata::cpu
