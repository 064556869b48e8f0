// The hyper-connection read of one decode token (docs/models/qwen4exp.md §3(a)) in three launches, where the
// chained kernels (norm.cuh's rms_norm_grouped, q8_32, gemv.cuh, hc.cuh) take eight:
//   hc_read_down: a stage launch makes Hn, the grouped RMSNorm of the raw streams, once, in the form the down and
//     inject weights read (q8_32, or float32 for float weights), and each stream's inverse RMS; then the down and
//     inject products and their gates, lo = silu(W_down Hn / hc) [rank], inj = 2 sigmoid(W_inj Hn / hc) [hc],
//     read Hn as the GEMVs read their activations (every CTA staging and quantizing Hn itself cost 14 us a read);
//   hc_read_up_mix: up = W_up lo, the block input x = (1/hc) Σ_k sigmoid(up_k) Hn_k [n] and x's q8_32 form,
//     so that the projections reading x skip their quantization (session/products/projection.hpp, project_quantized).
//     Each CTA stages lo (rank floats) in shared memory in the form the up weight's row dot takes.
// The row dots are the GEMVs' own device code (gemv_quant_rows.cuh, gemv_float_rows.cuh): the same arithmetic as
// the chain, up to summation order.
// Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemv.cuh"
#include "quantize.cuh"
#include "strata/forms.hpp"

namespace strata::kernels {

// The mixer's sizes: `streams` streams of n floats, the low rank and the grouped norm's epsilon.
struct HcReadShape {
  int streams = 0;
  int n = 0;
  int rank = 0;
  float eps = 0.0f;
};

// Whether the two launches take this shape and these weights (gemv.cuh's WeightMatrix: down [rank][streams * n],
// up [streams * n][rank], inject [streams][streams * n] or null): n and rank multiples of 32, streams a divisor of
// 32, every form one the GEMVs read, and an activation that fits a CTA's shared memory (kHcStagedBytes: float32
// for float weights, q8_32 for quantized ones, so float down or inject weights need streams * n <= 11008). Where
// it is false the decode program chains the eight kernels.
constexpr int kHcStagedBytes = 43 * 1024;  // with the kernels' static 4.4 KB, under the 48 KB of no opt-in
bool hc_read_fusable(const HcReadShape& shape, const WeightMatrix& down, const WeightMatrix& up,
                     const WeightMatrix* inject);

// Where hc_read_down leaves Hn [streams * n] for its products: float32 where a float down or inject weight reads
// it, q8_32 where a quantized one does (each may be none where no weight reads it). The caller's scratch, free
// once hc_read_down's launches have run.
struct HcReadStage {
  float* hn = nullptr;
  Q8Blocks hn_q8;
};

// streams [streams][n] the raw streams, norm [streams * n] the grouped norm's weight. Writes low [rank], inj
// [streams] (inject and inj null: the final mixer) and rms [streams], the streams' inverse RMS that
// hc_read_up_mix normalises with. Down and inject of one form share a launch; of two forms, one launch each.
// Shapes or weights hc_read_fusable refuses, or a stage lacking a form the weights read -> cudaErrorInvalidValue.
cudaError_t hc_read_down(const HcReadShape& shape, const float* streams, const float* norm, const WeightMatrix& down,
                         const WeightMatrix* inject, const HcReadStage& stage, float* low, float* inj, float* rms,
                         cudaStream_t stream);

// From hc_read_down's low and rms: x [n] and, where x_q8 asks for it (its readers' rule: session/products/projection.hpp,
// q8_for), x's q8_32 form, quantize_q8_32(x) bit for bit. Shapes or weights hc_read_fusable refuses ->
// cudaErrorInvalidValue.
cudaError_t hc_read_up_mix(const HcReadShape& shape, const float* streams, const float* norm, const float* rms,
                           const float* low, const WeightMatrix& up, float* x, const Q8Blocks& x_q8,
                           cudaStream_t stream);

}  // namespace strata::kernels
