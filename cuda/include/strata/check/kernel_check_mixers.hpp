// Host round trips of the decode-step mixer and plumbing kernels (GDN, paged attention + QSA, embedding
// gather, doorbell), so Python tests can check them against the numpy reference. Each call uploads its
// inputs, runs the kernels into poisoned, guarded outputs and copies them back. Not for the token path:
// these allocate and synchronise. Host-only header (no CUDA types).
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/check/q8_host.hpp"
#include "strata/kv_format.hpp"

namespace strata::kernel_check {

struct GdnCheckShape {
  int n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 0;
  bool tiled_heads = false, interleaved_ba = false, sigmoid_gate = false;
  float eps = 1e-6f;
};

// `steps` GDN decode tokens in sequence. Per-step inputs are stacked row-major: qkv [steps][C], z [steps][Hv*dv],
// beta_in [steps][Hv] (interleaved_ba: the ssm_ba output [steps][2*Hv]), alpha_in [steps][Hv] (unused when
// interleaved). conv_state [K-1][C] and state [Hv][dk][dv] are read and written back; out is [steps][Hv*dv]; with
// out_q8 ([steps] rows of Hv*dv) also the q8_32 form of each step's out that gdn_step writes beside it.
void gdn_steps(int device, const GdnCheckShape& shape, int steps, const float* qkv, const float* z,
               const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
               const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* out,
               const Q8Host& out_q8 = {});

// The GDN chunk (one gdn_chunk launch, captured into a CUDA graph) over `tokens` tokens of the same stacked
// inputs as gdn_steps, laid out on the device as the prompt program writes them: qkv and z parts of one fused
// row, beta_in and alpha_in rows of their own, and every row of inputs, conv_out and out followed by `row_pad`
// poisoned floats that must stay so. conv_state and state are read and written back; conv_out is
// [tokens][C] (each token's silu(conv)), out [tokens][Hv*dv]. With state_rows and conv_rows (both or neither),
// the row states: [tokens][Hv][dk][dv] and [tokens][K-1][C], each token's state and conv history, written on the
// device row_pad floats apart beyond the larger of the two (poison that must stay so).
void gdn_chunk(int device, const GdnCheckShape& shape, int tokens, int row_pad, const float* qkv, const float* z,
               const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
               const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* conv_out,
               float* out, float* state_rows = nullptr, float* conv_rows = nullptr);

struct AttentionCheckShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0, rope_dim = 0, page_size = 0;
  KvStorage kv = KvStorage::Bf16;
  float eps = 1e-6f;
};

// The QSA indexer inputs of an attention check (all per step, stacked); nullptr q disables QSA.
struct QsaCheckInputs {
  int n_heads = 0, head_dim = 0, keep_blocks = 0;
  int ratio = 4;                  // tokens per QSA block
  const float* q = nullptr;       // [steps][n_heads * head_dim] indexer q_proj outputs
  const float* kraw = nullptr;    // [steps][head_dim] indexer k_proj outputs
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;  // [head_dim]
};

// QSA outputs per step: scores [steps][steps / ratio] (entries past the step's block count are NaN),
// selected [steps][keep_blocks] (-1 past n_selected), n_selected [steps].
struct QsaCheckOutputs {
  float* scores = nullptr;
  int* selected = nullptr;
  int* n_selected = nullptr;
};

// Tokens 0..steps-1 through one captured CUDA graph (attention_prep, QSA when enabled, attention_decode),
// replayed once per token after rewriting the device position, as the session does. Logical page i of the
// cache lives in physical page page_order[i] (n_pages entries, covering `steps` tokens). Per-step inputs are
// stacked: q_gate [steps][H*2d], k, v [steps][Hkv*d]; rope tables [steps][rope_dim/2]. Outputs:
// out [steps][H*d], q [steps][H*d] (normed, roped, in the keys' basis: rotated for Q4 keys), and the cache as
// stored, dequantized (a Q4 half in its rotated basis): k_cache, v_cache [Hkv][steps][d]; with out_q8 ([steps]
// rows of H*d) also the q8_32 form of each step's out that attention_decode writes beside it.
void attention_steps(int device, const AttentionCheckShape& shape, int steps, const float* q_gate,
                     const float* k, const float* v, const float* q_norm, const float* k_norm,
                     const float* rope_cos, const float* rope_sin, const int* page_order, int n_pages,
                     const QsaCheckInputs& qsa, const QsaCheckOutputs& qsa_out, float* out, float* q_out,
                     float* k_cache, float* v_cache, const Q8Host& out_q8 = {});

// The KV rotation alone (kernels/kv_rotation.cuh): out [rows][head_dim] = the rotation of each row of in.
void kv_rotate_rows(int device, int rows, int head_dim, const float* in, float* out);

// The QSA top-block selection alone over given scores [n_blocks]: writes the chosen blocks (ascending) into
// selected [keep_blocks] (-1 past the count) and returns the count.
int qsa_top_blocks(int device, const float* scores, int n_blocks, int keep_blocks, int* selected);

// Decode attention timings (benchmarks/bench_attention.py): median seconds of one launch over `reps`, each timed
// alone with CUDA events after the L2 cache was overwritten. The cache holds arbitrary finite values.
struct AttentionTimingShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0, page_size = 64;
  KvStorage kv = KvStorage::Bf16;
  int context = 0;      // visible tokens: the query sits at position context - 1
  int keep_blocks = 0;  // QSA blocks attended, spread evenly over the context (and the open tail); 0: dense
  int ratio = 4;        // tokens per QSA block
};

struct IndexerTimingShape {
  int n_heads = 0, head_dim = 0, ratio = 4, keep_blocks = 0;
  int context = 0;  // visible tokens; the block keys and the query are random
};

// attention_decode (the split and merge kernels) at shape.context.
double time_attention_decode(int device, const AttentionTimingShape& shape, int reps);
// qsa_select (block scoring and selection) at shape.context, or with top_only its selection step alone.
double time_qsa_select(int device, const IndexerTimingShape& shape, bool top_only, int reps);

// Embedding rows: kind 0 F32, 1 F16, 2 BF16 (data as raw 2-byte values), 3 Q8_0 form (uint8 codes with
// bias 128 and fp16 scales d [rows][cols/32] as raw uint16). out [n_ids][cols].
void embed_rows(int device, int kind, int rows, int cols, const void* data, const std::uint16_t* d,
                const int* ids, int n_ids, float* out);

// `steps` PLE device-half tokens (ple.cuh) in sequence for hc streams of width n: ple_step once per token, or
// with `chunk` one ple_chunk over all of them. Per-step streams, key [steps][hc*n] and value [steps][n];
// weights norm_key, norm_query, norm_conv [hc*n], conv_weight [hc*n][K]. history [dilation*(K-1)][hc*n] is
// read and written back; out is [steps][hc*n]. With `chunk` and history_rows, the row states too:
// [steps][dilation*(K-1)][hc*n], the history as each token leaves it.
void ple_steps(int device, int streams, int width, int dilation, int conv_kernel, float eps, int steps, bool chunk,
               const float* stream_rows, const float* key, const float* value, const float* norm_key,
               const float* norm_query, const float* norm_conv, const float* conv_weight, float* history, float* out,
               float* history_rows = nullptr);

struct DoorbellCheckResult {
  int status = 0;      // 0, or the offset of the ring the wait gave up on
  int seq_seen = 0;    // the ring number the host thread saw (0 if it saw none)
};

// One publish -> host answer -> device wait round trip through mapped pinned memory. A host thread waits for
// the ring (up to 10 s), copies what was published into published_x [n], published_ids [k],
// published_weights [k], and, if `answer`, writes answer_row [n] and raises the flag. The device wait spins
// at most timeout_ns nanoseconds and then copies the answer into answered [n] (left NaN on a timeout).
DoorbellCheckResult doorbell_round_trip(int device, int n, int k, const float* x, const int* ids,
                                        const float* weights, int ring_base, int ring_offset, bool answer,
                                        const float* answer_row, long long timeout_ns, float* published_x,
                                        int* published_ids, float* published_weights, float* answered);

}  // namespace strata::kernel_check
