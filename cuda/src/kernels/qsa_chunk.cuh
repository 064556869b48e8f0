// The QSA indexer over a chunk of T prompt tokens at consecutive positions (the prompt path): each launcher
// gives what its decode twin (qsa.cuh) gives run once per token, in order. Positions come from device memory;
// launchers never allocate, synchronise or throw; bad sizes give cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qsa.cuh"

namespace strata::kernels {

// qsa_append for each of the T tokens: raw key rows kraw [T] (kraw_stride floats apart) at positions
// p .. p + T - 1, and the pooled key of every block the chunk completes, bit for bit as qsa_append leaves them.
cudaError_t qsa_append_chunk(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                             long kraw_stride, int tokens, const float* k_norm, const float* rope_cos,
                             const float* rope_sin, const int* positions, cudaStream_t stream);

struct IndexerSelectChunkArgs {
  const float* q = nullptr;         // [T] rows of [n_heads][head_dim] (the indexer q_proj output), q_stride apart
  long q_stride = 0;
  const float* q_norm = nullptr;    // [head_dim]
  const float* rope_cos = nullptr;  // [positions][rope_dim / 2]
  const float* rope_sin = nullptr;
  const int* positions = nullptr;   // device [T]: consecutive; query t sees positions[t] + 1 tokens
  float* scratch = nullptr;         // qsa_select_chunk_scratch_floats(shape, T) floats
  int* selected_blocks = nullptr;   // [T][keep_blocks] out: query t's blocks, ascending (as qsa_select)
  int* n_selected = nullptr;        // [T] out: min(keep_blocks, (positions[t] + 1) / ratio)
};

// Floats of scratch qsa_select_chunk needs for `tokens` queries: the scoring queries and a score row of
// max_blocks for each query in flight.
std::size_t qsa_select_chunk_scratch_floats(const IndexerShape& shape, int tokens);

// qsa_select for each of the T queries, over the block keys as the chunk's qsa_append_chunk leaves them (a
// query scores only the blocks complete at its position): the same selections, exactly, as the scores are
// computed with qsa_select's arithmetic.
cudaError_t qsa_select_chunk(const IndexerShape& shape, const IndexerCache& cache,
                             const IndexerSelectChunkArgs& args, int tokens, cudaStream_t stream);

}  // namespace strata::kernels
