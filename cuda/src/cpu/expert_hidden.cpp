#include "expert_hidden.hpp"

#include <algorithm>
#include <cmath>

namespace strata::cpu {
namespace {

constexpr int64_t kChunk = 32;  // rows per pass: the products live on the stack

float silu_times(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

}  // namespace

void expert_hidden(RowsKernel gate_kernel, const MatrixRows& gate, RowsKernel up_kernel, const MatrixRows& up,
                   int64_t r0, int64_t r1, const Activation& x, float* h) {
  for (int64_t c0 = r0; c0 < r1; c0 += kChunk) {
    const int64_t c1 = std::min(r1, c0 + kChunk);
    float g[kChunk], u[kChunk];
    gate_kernel(gate, c0, c1, x, 1.0f, g);
    up_kernel(up, c0, c1, x, 1.0f, u);
    for (int64_t r = c0; r < c1; ++r) h[r - r0] = silu_times(g[r - c0], u[r - c0]);
  }
}

void expert_hidden_batch(BatchKernel gate_kernel, const MatrixRows& gate, BatchKernel up_kernel, const MatrixRows& up,
                         int64_t r0, int64_t r1, const Activation* x, int n, float* const* h) {
  for (int64_t c0 = r0; c0 < r1; c0 += kChunk) {
    const int64_t c1 = std::min(r1, c0 + kChunk);
    float g[kMaxBatch][kChunk], u[kMaxBatch][kChunk];
    float* gs[kMaxBatch] = {g[0], g[1], g[2], g[3]};
    float* us[kMaxBatch] = {u[0], u[1], u[2], u[3]};
    gate_kernel(gate, c0, c1, x, n, 1.0f, gs);
    up_kernel(up, c0, c1, x, n, 1.0f, us);
    for (int a = 0; a < n; ++a)
      for (int64_t r = c0; r < c1; ++r) h[a][r - r0] = silu_times(g[a][r - c0], u[a][r - c0]);
  }
}

}  // namespace strata::cpu
