// Gated DeltaNet over a chunk of T consecutive tokens (the prompt path): what T calls of gdn_step (gdn.cuh) in
// order would do, in one launcher: the causal conv of every token (conv_state carried in and left as the last
// step leaves it), the L2-normalised gated delta rule with the fp32 state carried token by token, and the gated
// RMSNorm. Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gdn.cuh"
#include "state_spans.cuh"

namespace strata::kernels {

// The step's pointers, each per-token one now the first of `tokens` rows, `*_stride` floats apart (strides of at
// least the row's width: the projections of a chunk write qkv and z as parts of one fused row, e.g. qkv rows of
// stride conv_channels + Hv * dv with z = qkv + conv_channels). beta_in rows are [Hv], or the interleaved ssm_ba
// rows [2 * Hv]; alpha_in and alpha_stride are unused when interleaved_ba. conv_state [K-1][C] and state
// [Hv][dk][dv] are carried in place as by the step; conv_out rows get each token's silu(conv) as the step writes
// it, out rows the gated, normed core output.
// Row states (a verification step, docs/speculative.md): with state_rows and conv_rows set, the state and the conv
// history as the step of token t leaves them are also written at state_rows + t * row_stride and conv_rows +
// t * row_stride, for every t, so that the sequence can be cut back to any of the chunk's tokens.
// Spans (kernels/state_spans.cuh): with `spans`, the `tokens` rows are several spans of consecutive tokens, each
// of its own sequence: conv_state and state are offsets into each span's arena, state_rows and conv_rows offsets
// into its first row-state slot (a span without one keeps no row states), and each span's rows are what gdn_chunk
// over that span alone would make.
struct GdnChunkArgs : GdnStepArgs {
  int tokens = 0;
  int qkv_stride = 0, z_stride = 0, beta_stride = 0, alpha_stride = 0, conv_out_stride = 0, out_stride = 0;
  float* scratch = nullptr;  // [gdn_chunk_scratch_floats(shape, tokens)] device floats, the caller's
  float* state_rows = nullptr;  // optional: [tokens] states [Hv][dk][dv], row_stride floats apart
  float* conv_rows = nullptr;   // optional: [tokens] conv histories [K-1][C], row_stride floats apart
  long row_stride = 0;
  StepSpans spans;              // optional: none, one span of every token
};

// Floats of scratch gdn_chunk needs for `tokens` tokens: each token's normalised q, k per k-head and the beta and
// decay of every v-head.
std::size_t gdn_chunk_scratch_floats(const GdnShape& shape, int tokens);

// T tokens in order: out row t and conv_out row t are gdn_step's out and conv_out of token t, and conv_state and
// state are left as the T-th step leaves them, bit for bit. Shapes gdn_step refuses, tokens < 1, a stride
// below its row's width, no scratch, row states with a row_stride below a state's or a history's floats, or
// spans without their arrays: cudaErrorInvalidValue.
cudaError_t gdn_chunk(const GdnShape& shape, const GdnChunkArgs& args, cudaStream_t stream);

}  // namespace strata::kernels
