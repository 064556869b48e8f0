#include "expert_hidden.hpp"

#include <algorithm>
#include <cmath>

namespace strata::cpu {

void expert_hidden(RowsKernel gate_kernel, const MatrixRows& gate, RowsKernel up_kernel, const MatrixRows& up,
                   int64_t r0, int64_t r1, const Activation& x, float* h) {
  constexpr int64_t kChunk = 32;  // rows per pass: the products live on the stack
  for (int64_t c0 = r0; c0 < r1; c0 += kChunk) {
    const int64_t c1 = std::min(r1, c0 + kChunk);
    float g[kChunk], u[kChunk];
    gate_kernel(gate, c0, c1, x, 1.0f, g);
    up_kernel(up, c0, c1, x, 1.0f, u);
    for (int64_t r = c0; r < c1; ++r) {
      const float gv = g[r - c0];
      h[r - r0] = gv / (1.0f + std::exp(-gv)) * u[r - c0];
    }
  }
}

}  // namespace strata::cpu
