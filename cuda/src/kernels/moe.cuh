// The GPU side of a MoE block (docs/models/qwen3next.md §3.3): the shared expert's sigmoid gate, its
// SwiGLU between the GEMVs, the combine with the routed experts' answer, and for the routed experts held in
// VRAM their cache slots and weighted sum. Launchers never allocate, synchronise or throw: they are capturable
// into CUDA graphs (the gate and the slots travel in device memory).
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

// *gate = sigmoid(Σ_i w[i] x[i]) over n floats (w = ffn_gate_inp_shexp, a float32 vector).
cudaError_t shared_expert_gate(const float* w, const float* x, float* gate, int n, cudaStream_t stream);

// h[i] = silu(g[i]) * u[i] for i < n (g = gate GEMV output, u = up GEMV output; a merged gate_up output
// passes g = gu, u = gu + n).
cudaError_t swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream);

// out[i] = routed[i] + *gate * shared[i] for i < n: `routed` is the host's answer row (the weighted sum of
// the routed experts, doorbell.cuh), `shared` the shared expert's down output. out may alias routed.
cudaError_t moe_combine(const float* routed, const float* shared, const float* gate, float* out, int n,
                        cudaStream_t stream);

// slots[j] = slot_of[ids[j]] for j < k: where each routed expert of a token sits in its layer's VRAM cache
// (slot_of [n_expert], -1 for an expert the cache does not hold; ids lie in [0, n_expert), as the router's do).
cudaError_t expert_slots(const int* slot_of, const int* ids, int* slots, int k, cudaStream_t stream);

// out[i] = (accumulate ? out[i] : 0) + sum over j < k with slots[j] >= 0 of weights[j] * rows[j * n + i]: the
// cached experts' share of the routed sum (rows [k][n], the down products; rows of skipped j are never read).
// Deterministic: one fma per j in the order j = 0..k-1 from 0, then out[i] + that sum. rows must not overlap out.
cudaError_t moe_cached_sum(const float* rows, const int* slots, const float* weights, int k, int n, bool accumulate,
                           float* out, cudaStream_t stream);

}  // namespace strata::kernels
