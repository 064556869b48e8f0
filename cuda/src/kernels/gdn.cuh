// Gated DeltaNet decode step (docs/models/qwen3next.md §3.1, qwen4exp.md §3(b)): one token of the
// causal conv + L2-normalised gated delta rule + gated RMSNorm, given the projections computed by the GEMVs.
// Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include "quantize.cuh"

namespace strata::kernels {

struct GdnShape {
  int n_k_heads = 0;
  int n_v_heads = 0;           // a multiple of n_k_heads
  int head_k_dim = 0;
  int head_v_dim = 0;
  int conv_kernel = 0;         // 4 in every released model; 2..8 accepted
  bool tiled_heads = false;    // v-head h reads k-head h % Hk (qwen35 / qwen4exp GGUF) instead of h / (Hv/Hk)
  bool interleaved_ba = false; // qwen3next: `beta_in` is the ssm_ba output [Hk][b x r | a x r], alpha_in unused
  bool sigmoid_gate = false;   // qwen4exp output gate sigmoid(z); otherwise silu(z)
  float eps = 1e-6f;           // of the gated RMSNorm
  __host__ __device__ int conv_channels() const { return 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim; }
};

struct GdnStepArgs {
  const float* qkv = nullptr;          // [conv_channels] the attn_qkv projection, before the conv
  const float* z = nullptr;            // [Hv * dv] the attn_gate projection
  const float* beta_in = nullptr;      // [Hv] ssm_beta projection (or the interleaved ssm_ba output)
  const float* alpha_in = nullptr;     // [Hv] ssm_alpha projection
  const float* conv_weight = nullptr;  // [conv_channels][conv_kernel]; column K-1 multiplies the newest row
  const float* ssm_a = nullptr;        // [Hv] (negative)
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm_weight = nullptr;  // [dv] gated RMSNorm weight, shared by every head (no +1)
  float* conv_state = nullptr;         // [conv_kernel - 1][conv_channels] last raw qkv rows, oldest first
  float* state = nullptr;              // [Hv][dk][dv] fp32 recurrent state
  float* conv_out = nullptr;           // [conv_channels] scratch: silu(conv) of this token
  float* out = nullptr;                // [Hv * dv] gated, normed core output (input of ssm_out)
  Q8Blocks out_q8;                     // optional: out's q8_32 form (Hv * dv a multiple of 32), for a quantized
                                       // ssm_out; none by default
};

// One decode token: updates conv_state and state in place and writes out.
cudaError_t gdn_step(const GdnShape& shape, const GdnStepArgs& args, cudaStream_t stream);

}  // namespace strata::kernels
