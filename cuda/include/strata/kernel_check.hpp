// Host round trips of single kernels, so Python tests can check each one against the numpy reference.
// Each call copies its inputs to the device, poisons the output (NaN bytes) inside guard bands, runs the
// kernel, verifies that the guard bands are untouched, and copies the output back. Not for the token path:
// these allocate and synchronise.
#pragma once

#include <cstdint>
#include <string>

#include "strata/forms.hpp"

namespace strata::kernel_check {

// y = rms_norm(x) * w over `rows` rows of `cols` floats, computed on `device`.
void rms_norm(int device, const float* x, const float* w, float* y, int rows, int cols, float eps);

// Grouped RMSNorm: each row of groups * cols floats normalised per slice of `cols`, scaled by w [groups * cols].
void rms_norm_grouped(int device, const float* x, const float* w, float* y, int rows, int groups, int cols,
                      float eps);

// Gated RMSNorm per head (x, z, y [heads][head_dim], w [head_dim]); gate "sigmoid" or "silu".
void rms_norm_gated(int device, const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                    float eps, const std::string& gate);

// L2 norm per head: y = x / sqrt(sum x^2 + eps) over each row of head_dim.
void l2_norm(int device, const float* x, float* y, int heads, int head_dim, float eps);

// NEOX RoPE of x [tokens][heads][head_dim] (in: x, out: y) on the first rope_dim dims, at positions [tokens],
// from tables the host builds in float64 for theta (max position + 1 rows).
void rope_neox(int device, const float* x, const std::int32_t* positions, float* y, int tokens, int heads,
               int head_dim, int rope_dim, double theta);

// q8_32 of x [n] (n a multiple of 32): xq [n], dx [n / 32], sums [n / 32].
void quantize_q8_32(int device, const float* x, long n, std::int8_t* xq, float* dx, std::int32_t* sums);

// y [rows] = W x for a quantized W given by host planes (docs/forms.md): x is quantized to q8_32 on the
// device first, then the GEMV runs.
void gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                const float* x, float* y);

// y [rows] = W x for a float W [rows][cols] of `kind` (host bytes) and float32 x.
void gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, const float* x, float* y);

// Median time in seconds of one GEMV launch (CUDA events), with L2 cold: launches cycle through enough
// device copies of the weight to overflow the L2 cache. Inputs as gemv_quant / gemv_float.
double time_gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                       int reps);
double time_gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, int reps);

// Throws the error kind named by `kind` ("invalid_argument", "out_of_memory", "format", "cuda", "error"),
// so tests can prove that each arrives in Python as the right exception.
void raise_error(const std::string& kind);

}  // namespace strata::kernel_check
