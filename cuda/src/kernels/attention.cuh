// Gated attention decode over a paged KV cache (docs/models/qwen3next.md §3.2, qwen4exp.md §3(c)).
// The token's position and the QSA selection are read from device memory, so captured graphs replay them.
// Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include "kv.cuh"
#include "quantize.cuh"
#include "state_spans.cuh"

namespace strata::kernels {

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;   // divides n_head; q-head h uses kv-head h / (n_head / n_head_kv)
  int head_dim = 0;    // a multiple of 32, at most 512
  int rope_dim = 0;    // even, <= head_dim: NEOX RoPE over the first rope_dim dims
  float eps = 1e-6f;   // of the per-head q/k RMSNorm
};

struct AttentionPrepArgs {
  const float* q_gate = nullptr;   // [n_head][2 * head_dim]: per head [q | gate] (the attn_q projection)
  const float* k = nullptr;        // [n_head_kv][head_dim]
  const float* v = nullptr;        // [n_head_kv][head_dim]
  const float* q_norm = nullptr;   // [head_dim]
  const float* k_norm = nullptr;   // [head_dim]
  const float* rope_cos = nullptr; // [positions][rope_dim / 2]
  const float* rope_sin = nullptr;
  const int* position = nullptr;   // device: this token's position p
  float* q_out = nullptr;          // [n_head][head_dim] normed, roped q in the keys' basis (kv_query_basis)
};

// q/k RMSNorm + RoPE at *position; writes q_out and appends k, v to the cache at row *position in the
// cache's format (kv_store_row).
cudaError_t attention_prep(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                           cudaStream_t stream);

struct AttentionDecodeArgs {
  const float* q = nullptr;         // [n_head][head_dim] from attention_prep
  const float* q_gate = nullptr;    // [n_head][2 * head_dim]: the gate is each head's second half
  const int* position = nullptr;    // device: tokens 0..*position are visible
  // QSA selection (optional; nullptr = dense causal): ascending complete-block indices and their count,
  // plus the open tail block_tokens * (n / block_tokens) .. *position, always attended.
  const int* selected_blocks = nullptr;
  const int* n_selected = nullptr;
  int block_tokens = 4;
  // Scratch of attention_decode_partial_floats(shape) floats, carved as [n_head][kDecodeSplits] maxima, sums,
  // then [n_head][kDecodeSplits][head_dim] accumulators (the split kernel's partials, the merge's input).
  float* partial_max = nullptr;
  float* partial_sum = nullptr;
  float* partial_acc = nullptr;
  float* out = nullptr;             // [n_head][head_dim] = softmax(q k^T / sqrt(d)) v * sigmoid(gate), with
                                    // q, k, v in the cache's bases and the sum rotated back (kv_output_basis)
  Q8Blocks out_q8;                  // optional: out's q8_32 form, for a quantized attn_output; none by default
};

constexpr int kDecodeSplits = 64;   // spans of the attended tokens: blocks per kv head
constexpr int kMaxHeadDim = 512;

// Whether attention_decode takes `shape` (its q heads per kv head and head_dim fit the split kernel's shared
// memory and registers); sessions check it once, up front.
bool attention_decode_fits(const AttentionShape& shape);
// Floats of the partials scratch attention_decode needs for `shape`.
size_t attention_decode_partial_floats(const AttentionShape& shape);

// Carves `scratch` (attention_decode_partial_floats(shape) floats) into args' partial_* pointers.
inline void carve_attention_partials(const AttentionShape& shape, float* scratch, AttentionDecodeArgs& args) {
  const size_t per_head = static_cast<size_t>(shape.n_head) * kDecodeSplits;
  args.partial_max = scratch;
  args.partial_sum = scratch + per_head;
  args.partial_acc = scratch + 2 * per_head;
}

cudaError_t attention_decode(const AttentionShape& shape, const AttentionDecodeArgs& args, const PagedKv& kv,
                             cudaStream_t stream);

// Several rows at once (a step of several rows, docs/rows.md), each its own token at its own position in its own
// sequence's cache: row r is at positions[r], and its cache is `kv` (its pointers offsets into an arena) in the
// arena of row r's span (kernels/state_spans.cuh). Rows of one span are consecutive positions of one sequence.
struct AttentionRows {
  const int* positions = nullptr;  // device [rows]
  StepSpans spans;
  int rows = 0;
};

// attention_prep of every row: row r's q_gate, k, v and q_out are args' moved r rows on (rows of 2 * n_head,
// n_head_kv, n_head_kv and n_head head_dims); args.position is unused. Every row's k and v are in its cache when
// the launch ends.
cudaError_t attention_prep_rows(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                                const AttentionRows& rows, cudaStream_t stream);

// attention_decode of every row after attention_prep_rows: row r's q, q_gate and out are args' moved r rows on,
// its selection selected_blocks + r * selection_stride and n_selected + r (with a selection), its partials
// args' moved r * attention_decode_partial_floats(shape) floats on, its out_q8 the q8_32 form of its out row (the
// rows' forms one after another); args.position is unused. Each row's output is attention_decode's for it, bit
// for bit.
cudaError_t attention_decode_rows(const AttentionShape& shape, const AttentionDecodeArgs& args, int selection_stride,
                                  const PagedKv& kv, const AttentionRows& rows, cudaStream_t stream);

}  // namespace strata::kernels
