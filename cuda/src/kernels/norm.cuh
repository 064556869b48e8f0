// RMSNorm family. Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   for r < rows; w has `cols` entries.
cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int cols, float eps,
                     cudaStream_t stream);

}  // namespace strata::kernels
