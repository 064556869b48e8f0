// RMSNorm family and L2 norm; y may alias x (each element is read before it is written). Launchers never
// allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include "quantize.cuh"

namespace strata::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   for r < rows; w has `cols` entries. With y_q8, also
// y's q8_32 form [rows * cols], the bits quantize_q8_32(y) writes (cols a multiple of 32).
cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int cols, float eps, cudaStream_t stream,
                     const Q8Blocks& y_q8 = {});

// Each row of `groups * cols` floats is `groups` slices (e.g. the 4 hyper-connection streams), each
// RMS-normalised on its own, then scaled by the flat weight w [groups * cols] (one gamma slice per slice).
cudaError_t rms_norm_grouped(const float* x, const float* w, float* y, int rows, int groups, int cols, float eps,
                             cudaStream_t stream);

enum class Gate : int { Sigmoid = 0, Silu = 1 };

// Gated RMSNorm per head: y[h, :] = rms_norm(x[h, :]) * w * gate(z[h, :]) over `heads` rows of head_dim,
// w [head_dim] shared by all heads; gate(z) = sigmoid(z) or silu(z) = z * sigmoid(z). With y_q8, also y's
// q8_32 form [heads * head_dim], the bits quantize_q8_32(y) writes (head_dim a multiple of 32: a CTA's head is
// whole blocks).
cudaError_t rms_norm_gated(const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                           float eps, Gate gate, cudaStream_t stream, const Q8Blocks& y_q8 = {});

// The same over `rows` rows (tokens) of `heads` heads: row r of x and y starts at r * x_stride floats, of z at
// r * z_stride (z may be a part of a wider fused projection row); strides of at least heads * head_dim.
cudaError_t rms_norm_gated_rows(const float* x, int x_stride, const float* z, int z_stride, const float* w, float* y,
                                int rows, int heads, int head_dim, float eps, Gate gate, cudaStream_t stream);

// L2 norm per head: y[h, :] = x[h, :] / sqrt(Σ x[h, :]^2 + eps) (eps inside the root, as the GDN uses it).
cudaError_t l2_norm(const float* x, float* y, int heads, int head_dim, float eps, cudaStream_t stream);

}  // namespace strata::kernels
