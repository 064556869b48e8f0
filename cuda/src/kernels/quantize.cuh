// q8_32 activation quantization (docs/forms.md, "Activation contract"). Launchers never allocate,
// synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

constexpr int kQ8Block = 32;

// The q8_32 form of an activation of n floats in device memory: codes xq [n], scales dx and code sums
// sums [n / 32]. The kernels that produce an activation take one as an optional output beside their floats
// (q8_32_blocks.cuh); the default, all null, asks for none.
struct Q8Blocks {
  std::int8_t* xq = nullptr;
  float* dx = nullptr;
  std::int32_t* sums = nullptr;
};

// The blocks of q8 from element `elements` (a multiple of 32) on; none stays none.
__host__ __device__ inline Q8Blocks q8_offset(const Q8Blocks& q8, long elements) {
  if (q8.xq == nullptr) return {};
  return {q8.xq + elements, q8.dx + elements / kQ8Block, q8.sums + elements / kQ8Block};
}

// Per block of 32 consecutive x: dx = max|x| / 127, xq = round_half_away_from_zero(x / dx) (0 when dx is 0),
// sums = Σ xq. `n` (a multiple of 32) may span several rows of a batch: blocks never straddle rows because
// every row length is a multiple of 32. xq [n], dx [n/32], sums [n/32]. x must be finite.
cudaError_t quantize_q8_32(const float* x, std::int8_t* xq, float* dx, std::int32_t* sums, long n,
                           cudaStream_t stream);

}  // namespace strata::kernels
