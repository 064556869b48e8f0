// QSA indexer of qwen4exp attention layers (docs/models/qwen4exp.md §3(c)): raw key append with block
// pooling, block scoring and the top-k block selection that attention_decode consumes.
// Per-token values come from device memory; launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include "state_spans.cuh"

namespace strata::kernels {

struct IndexerShape {
  int n_heads = 0;       // query heads (4)
  int head_dim = 0;      // 128
  int ratio = 4;         // tokens per compressed block
  int keep_blocks = 0;   // budget / ratio (512)
  int rope_dim = 0;      // the attention's rotary dims (64); <= head_dim
  int max_blocks = 0;    // capacity of the block key cache and of the score scratch
  float eps = 1e-6f;
};

struct IndexerCache {
  float* raw_keys = nullptr;    // [max_blocks * ratio][head_dim] raw k_proj rows (not normed, not roped)
  float* block_keys = nullptr;  // [max_blocks][head_dim] pooled keys: mean, k_norm, RoPE at the block start
};

// Stores kraw [head_dim] at row *position; when that completes a block, pools it into block_keys.
cudaError_t qsa_append(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                       const float* k_norm, const float* rope_cos, const float* rope_sin, const int* position,
                       cudaStream_t stream);

struct IndexerSelectArgs {
  const float* q = nullptr;         // [n_heads][head_dim] the indexer q_proj output
  const float* q_norm = nullptr;    // [head_dim]
  const float* rope_cos = nullptr;  // [positions][rope_dim / 2]
  const float* rope_sin = nullptr;
  const int* position = nullptr;    // device: the query position p (n = p + 1 tokens visible)
  float* scores = nullptr;          // [max_blocks] scratch: sum_h relu(q_h . k_b) / sqrt(head_dim)
  int* selected_blocks = nullptr;   // [keep_blocks] out: chosen complete blocks, ascending
  int* n_selected = nullptr;        // out: min(keep_blocks, n / ratio)
};

// Scores the (p + 1) / ratio complete blocks and keeps the best keep_blocks; equal scores go to the lower index.
cudaError_t qsa_select(const IndexerShape& shape, const IndexerCache& cache, const IndexerSelectArgs& args,
                       cudaStream_t stream);

// The selection step of qsa_select alone, over args.scores as they are (q, q_norm and the rope table unused).
cudaError_t qsa_top_blocks(const IndexerShape& shape, const IndexerSelectArgs& args, cudaStream_t stream);

// Several rows at once (a step of several rows, docs/rows.md), each its own token at positions[r] in the cache of
// its own sequence: `cache`'s pointers are offsets into the arena of row r's span (kernels/state_spans.cuh).
struct IndexerRows {
  const int* positions = nullptr;  // device [rows]
  StepSpans spans;
  int rows = 0;
};

// qsa_append of every row, kraw [rows][head_dim]: the raw keys first, then the blocks they complete pooled (a
// block may hold several rows of one span), so the caches end as the rows appended one by one leave them.
cudaError_t qsa_append_rows(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                            const float* k_norm, const float* rope_cos, const float* rope_sin,
                            const IndexerRows& rows, cudaStream_t stream);

// qsa_select of every row after qsa_append_rows: row r's q is args.q + r * q_stride, its scores args.scores + r *
// max_blocks, its selection selected_blocks + r * keep_blocks and n_selected + r; args.position is unused. A row
// scores only the blocks complete at its own position, so each selection is qsa_select's for its row.
cudaError_t qsa_select_rows(const IndexerShape& shape, const IndexerCache& cache, const IndexerSelectArgs& args,
                            int q_stride, const IndexerRows& rows, cudaStream_t stream);

}  // namespace strata::kernels
