// Gated attention over a chunk of T prompt tokens at consecutive positions (the prompt path): each launcher
// gives what its decode twin (attention.cuh) gives run once per token, in order. Positions and the QSA
// selections are read from device memory, so captured graphs replay them. Launchers never allocate,
// synchronise or throw; bad sizes give cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention.cuh"
#include "kv.cuh"

namespace strata::kernels {

struct AttentionChunkPrepArgs {
  const float* q_gate = nullptr;   // [T] rows of [n_head][2 * head_dim] (per head [q | gate]), q_gate_stride apart
  const float* k = nullptr;        // [T] rows of [n_head_kv][head_dim], k_stride apart
  const float* v = nullptr;        // [T] rows of [n_head_kv][head_dim], v_stride apart
  long q_gate_stride = 0;          // floats between rows; the rows may be slices of one fused projection row
  long k_stride = 0;
  long v_stride = 0;
  const float* q_norm = nullptr;   // [head_dim]
  const float* k_norm = nullptr;   // [head_dim]
  const float* rope_cos = nullptr; // [positions][rope_dim / 2]
  const float* rope_sin = nullptr;
  const int* positions = nullptr;  // device [T]: consecutive positions p .. p + T - 1
  float* q_out = nullptr;          // [T][n_head][head_dim] as attention_prep writes each token's q_out
};

// attention_prep for each of the T tokens: the same K and V cells (bit for bit, every KV format) and q rows.
cudaError_t attention_prep_chunk(const AttentionShape& shape, const AttentionChunkPrepArgs& args, int tokens,
                                 const PagedKv& kv, cudaStream_t stream);

struct AttentionChunkArgs {
  const float* q = nullptr;         // [T][n_head][head_dim] from attention_prep_chunk
  const float* q_gate = nullptr;    // [T] rows, q_gate_stride apart: the gate is each head's second half
  long q_gate_stride = 0;
  const int* positions = nullptr;   // device [T]: query t sees tokens 0..positions[t] (all in the cache)
  // QSA selections (optional; nullptr = dense causal), as qsa_select_chunk leaves them: query t attends its
  // n_selected[t] blocks selected_blocks[t * selection_stride ...] (ascending) and its open tail block.
  const int* selected_blocks = nullptr;
  const int* n_selected = nullptr;
  int selection_stride = 0;         // ints between queries' selections (the indexer's keep_blocks)
  int block_tokens = 4;
  // How a block finds the tokens to read (both modes give each query the same tokens and outputs, within an
  // online softmax's reordering). false, the scan: a block serves a tile of consecutive queries and walks the
  // union of their tokens by position, 32 at a time, so queries share each K/V tile load; best where their
  // tokens overlap (dense causal, or QSA inside the dense range). true, gathered: a block serves one query and
  // reads its own tokens compacted (its selected blocks' tokens, then its open tail), so every tile is full;
  // best where every query is past the dense range, as there the selections of neighbouring queries differ and
  // the scan's union grows with the context. Dense chunks (no selection) run too, reading each query's 0..p
  // alone: correct, but slower than the scan.
  bool gathered = false;
  float* scratch = nullptr;         // attention_chunk_scratch_floats(shape, T) floats (may be null when that is 0)
  float* out = nullptr;             // [T][n_head * head_dim] as attention_decode writes each token's out
};

// Whether attention_chunk takes `shape`: what attention_decode takes, with the q heads of one kv head fitting
// one block's rows and the current device's shared memory.
bool attention_chunk_fits(const AttentionShape& shape);

// Spans attention_chunk cuts each of `tokens` queries' tokens into in the given mode (0 for a bad shape or
// count): 1 for a chunk whose blocks fill the GPU (qwen4exp: from ~660 tokens scanned, ~132 gathered); a
// shorter one computes the spans apart and merges them (as attention_decode does), their partials in scratch.
int attention_chunk_spans(const AttentionShape& shape, int tokens, bool gathered);

// Floats of scratch attention_chunk needs for `tokens` queries in either mode: none where neither cuts spans,
// else room for the spans' partials (qwen4exp: at most ~16 MB).
std::size_t attention_chunk_scratch_floats(const AttentionShape& shape, int tokens);

// attention_decode for each of the T queries over the cache as the whole chunk leaves it (a query reads no
// token past its own position), by scan or gathered (args.gathered).
cudaError_t attention_chunk(const AttentionShape& shape, const AttentionChunkArgs& args, int tokens,
                            const PagedKv& kv, cudaStream_t stream);

}  // namespace strata::kernels
