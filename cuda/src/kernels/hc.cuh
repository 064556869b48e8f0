// The elementwise pieces of qwen4exp's hyper-connection mixer (docs/models/qwen4exp.md §3(a)); the
// grouped RMSNorm is norm.cuh's rms_norm_grouped and the projections are gemv.cuh's. Launchers never
// allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

enum class Activation : int { Sigmoid = 0, Silu = 1 };

// out[i] = post * act(pre * in[i]) for i < n. The mixer's low-rank activation lo = silu(down / 4) is
// (Silu, 1/4, 1); its injection weights inj = 2 * sigmoid(inject / 4) are (Sigmoid, 1/4, 2). out may alias in.
cudaError_t scaled_activation(const float* in, float* out, int n, Activation act, float pre, float post,
                              cudaStream_t stream);

// The block input x[i] = (1/streams) Σ_k sigmoid(up[k*n + i]) * normed[k*n + i] for i < n: the sigmoid of the
// up projection gates each normalised stream, then the streams are averaged.
cudaError_t hc_mix(const float* up, const float* normed, float* x, int streams, int n, cudaStream_t stream);

// The write-back H[k*n + i] += inj[k] * y[i] for every stream k < streams (onto the raw streams).
cudaError_t hc_write(float* h, const float* inj, const float* y, int streams, int n, cudaStream_t stream);

}  // namespace strata::kernels
