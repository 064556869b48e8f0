// q8_32 activation quantization (docs/forms.md, "Activation contract"). Launchers never allocate,
// synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

constexpr int kQ8Block = 32;

// Per block of 32 consecutive x: dx = max|x| / 127, xq = round_half_away_from_zero(x / dx) (0 when dx is 0),
// sums = Σ xq. `n` (a multiple of 32) may span several rows of a batch: blocks never straddle rows because
// every row length is a multiple of 32. xq [n], dx [n/32], sums [n/32]. x must be finite.
cudaError_t quantize_q8_32(const float* x, std::int8_t* xq, float* dx, std::int32_t* sums, long n,
                           cudaStream_t stream);

}  // namespace strata::kernels
