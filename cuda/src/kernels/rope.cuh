// NEOX (rotate-half) RoPE on the first rope_dim dims of each head. Launchers never allocate, synchronise or
// throw: they are capturable into CUDA graphs (positions are read from device memory, never baked in).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

// cos/sin tables [max_position][rope_dim / 2] for theta, computed in float64 on the host, rounded to float.
void build_rope_tables(float* cos_table, float* sin_table, int max_position, int rope_dim, double theta);

// In place on x [tokens][heads][head_dim]: for i < rope_dim/2, with c, s = table[positions[t]][i],
// (a, b) = (x[i], x[i + rope_dim/2]) -> (a c - b s, b c + a s); dims >= rope_dim pass through.
// positions [tokens] (device) must lie in [0, max_position) of the tables.
cudaError_t rope_neox(float* x, const std::int32_t* positions, const float* cos_table, const float* sin_table,
                      int tokens, int heads, int head_dim, int rope_dim, cudaStream_t stream);

}  // namespace strata::kernels
