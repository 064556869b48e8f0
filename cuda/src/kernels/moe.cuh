// The GPU side of a MoE block (docs/models/qwen3next.md §3.3): the shared expert's sigmoid gate, its
// SwiGLU between the GEMVs, the combine with the routed experts' answer, and for the routed experts held in
// VRAM their weighted sum (their cache slots come with the router: router_publish.cuh). The per-token kernels
// run over `rows` (or `tokens`) tokens in one launch, one contiguous row per token (decode passes 1).
// Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs (the gates, slots and
// row indices travel in device memory).
#pragma once

#include <cuda_runtime.h>

#include "quantize.cuh"

namespace strata::kernels {

// gate[r] = sigmoid(Σ_i w[i] x[r][i]) for r < rows (w = ffn_gate_inp_shexp, a float32 vector [n]; x [rows][n]).
cudaError_t shared_expert_gate(const float* w, const float* x, float* gate, int rows, int n, cudaStream_t stream);

// h[i] = silu(g[i]) * u[i] for i < n (g = gate GEMV output, u = up GEMV output; a merged gate_up output
// passes g = gu, u = gu + n). With h_q8, also h's q8_32 form [n] (n a multiple of 32), for a quantized down.
cudaError_t swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream, const Q8Blocks& h_q8 = {});

// out[r][i] = routed[r][i] + gate[r] * shared[r][i] (all [rows][n], gate [rows]): `routed` is the routed
// experts' weighted sum (the host's answer row, doorbell.cuh, plus the cached experts' share), `shared` the
// shared expert's down output. out may alias routed.
cudaError_t moe_combine(const float* routed, const float* shared, const float* gate, float* out, int rows, int n,
                        cudaStream_t stream);

// For every token t < tokens: out[t][i] = (accumulate ? out[t][i] : 0) + sum over j < k with slots[t*k+j] >= 0
// of weights[t*k+j] * rows[t*k+j][i]: the cached experts' share of the routed sum (rows [tokens*k][n], the down
// products; rows of skipped j are never read; out [tokens][n]). Deterministic: one fma per j in the order
// j = 0..k-1 from 0, then out[t][i] + that sum. rows must not overlap out.
cudaError_t moe_cached_sum(const float* rows, const int* slots, const float* weights, int tokens, int k, int n,
                           bool accumulate, float* out, cudaStream_t stream);

// out[t][i] = sum over j < k with row_of[t*k+j] >= 0 of weights[t*k+j] * rows[row_of[t*k+j]][i] for t < tokens:
// a prompt chunk computes each routed expert once for all the tokens that chose it, its output rows grouped
// by expert; this puts them back per token (row_of, weights [tokens][k]; each row_of >= 0 a row of `rows`;
// out [tokens][n]). The same sum as moe_cached_sum without accumulate: one fma per j in j order from 0, no
// atomics. rows must not overlap out.
cudaError_t moe_weighted_rows(const float* rows, const int* row_of, const float* weights, int tokens, int k, int n,
                              float* out, cudaStream_t stream);

// slots[i] = slot_of[ids[i]] for i < count: the VRAM cache's slot of each routed expert (-1: not held), for rows
// whose routing stays on the device (a batched step whose every expert is cached; decode's router launch fills
// its one row's slots itself).
cudaError_t cache_slots(const int* slot_of, const std::int32_t* ids, int count, int* slots, cudaStream_t stream);

// dst[i] = src[index[i]] for i < m, rows of n floats (each index a row of src): the input rows of the tokens
// that chose one routed expert, gathered for its batched product. dst must not overlap src.
cudaError_t gather_rows(const float* src, const int* index, int m, int n, float* dst, cudaStream_t stream);

}  // namespace strata::kernels
