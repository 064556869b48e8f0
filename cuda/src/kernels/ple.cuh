// The device half of qwen4exp's PLE block (docs/models/qwen4exp.md §3(d)) for one decode token or a chunk of
// prompt tokens, given the ple_key / ple_value projections of the gathered n-gram rows (the GEMVs are
// elsewhere): grouped RMSNorms, the signed-sqrt sigmoid gate per stream, the dilated depthwise causal conv and
// its history advance. Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include "state_spans.cuh"

namespace strata::kernels {

struct PleShape {
  int streams = 0;      // hyper-connection streams hc
  int width = 0;        // n_embd n
  int dilation = 0;     // the n-gram order (3)
  int conv_kernel = 0;  // 2..8
  float eps = 1e-6f;
  __host__ __device__ int history_rows() const { return dilation * (conv_kernel - 1); }
};

struct PleStepArgs {
  const float* streams = nullptr;      // [hc][n] the layer's input streams
  const float* key = nullptr;          // [hc * n] ple_key projection
  const float* value = nullptr;        // [n] ple_value projection
  const float* norm_key = nullptr;     // [hc * n] grouped RMSNorm weights
  const float* norm_query = nullptr;
  const float* norm_conv = nullptr;
  const float* conv_weight = nullptr;  // [hc * n][conv_kernel]; column K-1 multiplies this token
  float* history = nullptr;            // [history_rows][hc * n] normed gated rows, oldest first; advanced in place
  float* out = nullptr;                // [hc][n] the addend: gated + silu(conv)
  // ple_chunk only, optional (a verification step's row states): the history as token t leaves it, for every t of
  // the chunk, at history_rows + t * row_stride (row_stride >= history_rows * hc * n floats).
  float* history_rows = nullptr;
  long row_stride = 0;
};

cudaError_t ple_step(const PleShape& shape, const PleStepArgs& args, cudaStream_t stream);

// `tokens` consecutive tokens at once, the same bits as `tokens` calls of ple_step in order: the per-token
// buffers of args are [tokens] rows (streams, out [tokens][hc][n], key [tokens][hc * n], value [tokens][n]),
// the weights and history as for ple_step; history is left as those calls would leave it. Two launches: the
// addends of every token (each token's conv reads its predecessors' normed rows, recomputed from their inputs,
// or the history), then the history advance (and the row states). out must not overlap history.
// With `spans` (kernels/state_spans.cuh), the tokens are several spans of consecutive tokens, each of its own
// sequence: history is an offset into each span's arena, history_rows one into its first row-state slot, and
// each span's rows are what ple_chunk over that span alone would make.
cudaError_t ple_chunk(const PleShape& shape, const PleStepArgs& args, int tokens, cudaStream_t stream,
                      const StepSpans& spans = {});

}  // namespace strata::kernels
