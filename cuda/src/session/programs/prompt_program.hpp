// The prompt path (docs/prompt.md): a chunk of tokens at consecutive positions through every layer at once,
// into the same sequence state the decode program reads and writes. Dense projections are products over the
// chunk's rows; the mixers run over the chunk; each routed expert is computed once for every token of the chunk
// that chose it, on the GPU, from the VRAM cache where it holds the expert and otherwise from the staging, which
// copies the experts from the pool's pinned host planes, the whole next layer ahead when the chunk touches most
// of it. Host-driven: each MoE layer's routing comes back to the host, which groups it and enqueues the copies.
// Each layer runs the layer recipe (layer_recipe.hpp) over the chunk's rows, the routing's round trip its hand-off.
//
// The same program runs a step of several rows (docs/rows.md, programs/prompt_rows.cu): spans of consecutive
// tokens, each of its own sequence (one decode token of each of several sessions, the k + 1 rows of a verification),
// with the decode program's mixer kernels over rows: each row's state through its span's arena, read from device
// memory, so one graph of a step replays for any sequences.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../kernels/doorbell.cuh"
#include "../../kernels/gdn_chunk.cuh"
#include "../../kernels/hc.cuh"
#include "../../kernels/state_spans.cuh"
#include "../../runtime/device_buffer.hpp"
#include "../../runtime/pinned_memory.hpp"
#include "../experts/chunk_experts.hpp"
#include "program_inputs.hpp"
#include "../products/projection.hpp"
#include "strata/decode_session.hpp"
#include "strata/expert_cache.hpp"
#include "strata/expert_pool.hpp"
#include "strata/expert_staging.hpp"

namespace strata {

// A step's spans in device memory (and, first, in the program's pinned block): each span's arena and row slot,
// each row's span, each row's sequence's seen ids (the penalty's history, which its token joins), and each row's
// sequence's control vector table [n_layer][n_embd] (null: it has none; kernels::StreamAddend).
struct RowsTable {
  kernels::StateSpan spans[kMaxStepRows];
  int span_of[kMaxStepRows];
  int* seen[kMaxStepRows];
  const float* steering[kMaxStepRows];
};

// The chunk's buffers, one row per token ([chunk][...]), carved out of one allocation (prompt_program.cu).
struct PromptScratch {
  int *tokens_ = nullptr, *positions_ = nullptr;
  Q8Scratch q8_, ex_x8_, ex_h8_;
  float *streams_ = nullptr, *x_ = nullptr, *y_ = nullptr, *normed_ = nullptr, *down_ = nullptr, *up_ = nullptr;
  float *inject_ = nullptr, *inj_attn_ = nullptr, *inj_ffn_ = nullptr;
  float *qkvz_ = nullptr, *beta_ = nullptr, *alpha_ = nullptr, *conv_out_ = nullptr, *core_ = nullptr;
  float* gdn_scratch_ = nullptr;  // gdn_chunk's per-token norms and gates
  float *qg_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *attn_ = nullptr, *iq_ = nullptr, *ik_ = nullptr;
  float *qsa_scratch_ = nullptr, *attention_scratch_ = nullptr;  // the chunk kernels'
  int *selected_ = nullptr, *n_selected_ = nullptr;              // [chunk][keep_blocks], [chunk]
  float *router_logits_ = nullptr, *route_weights_ = nullptr;
  int* route_ids_ = nullptr;
  float *sh_g_ = nullptr, *sh_u_ = nullptr, *sh_h_ = nullptr, *shared_ = nullptr, *shared_gate_ = nullptr;
  float* routed_ = nullptr;
  int *row_token_ = nullptr, *row_of_ = nullptr;  // the chunk's routes (ChunkRoutes)
  int *group_slot_ = nullptr, *group_begin_ = nullptr;
  float *ex_x_ = nullptr, *ex_gate_ = nullptr, *ex_up_ = nullptr, *ex_hidden_ = nullptr, *ex_rows_ = nullptr;
  float *ple_rows_ = nullptr, *ple_key_ = nullptr, *ple_value_ = nullptr, *ple_out_ = nullptr;
  float* logits_ = nullptr;  // a block of rows' logits, when every position's are asked for
  int *pair_row_ = nullptr, *pair_slots_ = nullptr;  // a step's routed pairs on the device: row i / k, cache slot
  char* kv_layer_ = nullptr;  // KV streaming: one attention layer's whole KV while the chunk runs it
  // A step of several rows: its spans (RowsTable, copied up from the pinned block), each row's QSA block scores
  // and attention partials.
  RowsTable* rows_table_ = nullptr;
  float *rows_scores_ = nullptr, *rows_partials_ = nullptr;
};

// One span of a step of several rows: `state.count` tokens at consecutive positions of one sequence, rows
// state.first .. of the step.
struct RowsSpan {
  kernels::StateSpan state;     // its arena and, where it keeps each row's state, its first row slot
  int* seen = nullptr;          // the sequence's every token fed, for the repetition penalty
  int position = 0;             // its first row's
  const int* tokens = nullptr;  // host [state.count]
  const Steering* steering = nullptr;  // the sequence's control vectors (null: none)
};

// Prompt path counters since the session began (DecodeStats reads them).
struct PromptStats {
  long tokens = 0, chunks = 0;
  long staged_experts = 0, cached_experts = 0;  // routed (layer, expert) computations, by where the weights were
  std::size_t staged_bytes = 0;                 // bytes the staging copied over PCIe
  long pooled_experts = 0;                      // ... and those the CPU pool computed
};

// The doorbell through which a step of several rows hands the routed experts the VRAM cache lacks to the CPU pool
// (one ring a MoE layer for all the rows: the Runner answers it with ExpertPool::run_rows_sum). No bell (null x):
// such a step's experts are grouped by the host as a prompt chunk's are.
struct RowsExchange {
  kernels::Doorbell bell;
  const int* ring_base = nullptr;  // device-visible: the step's ring base, staged before each launch or replay
  int* status = nullptr;           // device-visible: the offset of a ring whose answer never came (0: none)
  long long timeout_ns = 0;        // how long a layer's wait for its answer lasts
};

class PromptProgram : private PromptScratch {
 public:
  // A program for chunks of up to `chunk` tokens of the sequence and model that `in` gives (the decode program
  // of the same sequence reads the same inputs). `staging` (required when the model has routed experts the cache
  // lacks) and `cache` (may be null) outlive it.
  // With `pool` and a `cpu_share` in (0, 1), a chunk too small to prefetch whole layers has the pool compute
  // that share of the bytes of the experts it touches that the cache lacks, while the staging copies the rest.
  PromptProgram(const ModelGeometry& geometry, const ProgramInputs& in, int device, int chunk,
                ExpertStaging* staging, const ExpertCache* cache, cpu::ExpertPool* pool = nullptr,
                double cpu_share = 0.0, const RowsExchange& exchange = {});

  // Device bytes of the scratch for chunks of `chunk` tokens in a sequence of `context` (whole pages) whose KV is
  // in `kv`, streamed or not: what the memory plan counts.
  static std::size_t scratch_bytes(const ModelGeometry& g, int chunk, int context, KvStorage kv, bool kv_streaming);

  int chunk() const noexcept { return chunk_; }

  // Runs `n` (1..chunk()) tokens at positions position .. position + n - 1 through every layer, in order on `s`,
  // and leaves the last token's residual streams where the decode program's end() reads them. ple_rows: [n]
  // rows of the PLE table rows (null without PLE). With `logits` ([n][n_vocab] host floats), every position's
  // logits land there. With `row_states`, each token's recurrent state is also kept in the sequence's row states
  // (a verification step; n at most their count). Returns when the work is enqueued past the last layer's routing
  // (the host waits for each MoE layer's routing), or, with logits, done.
  void run(const int* tokens, int n, int position, const float* ple_rows, float* logits, bool row_states,
           cudaStream_t s);

  // A step of several rows (docs/rows.md): `n_spans` spans of consecutive tokens, each of its own sequence (of
  // this program's geometry, context and KV format, none streaming its KV), the spans' rows one after another from
  // row 0, at most max_step_rows() in all. stage_step writes the rows' tokens, positions, PLE rows (ple_rows: [rows],
  // null without PLE) and the spans into the program's pinned block; enqueue_step then enqueues the step on `s`:
  // every row through every layer at once (the dense products over all rows; the mixers and the PLE layer one
  // launch a layer for all rows, each row's state through its span; each routed expert once for the rows that
  // chose it), each span's row states kept where it names a row slot, each row's logits at step_logits(row), and
  // its token in its sequence's seen ids. Each row is, bit for bit, what its span alone gives. Where
  // step_on_device(), the routed experts run from the VRAM cache with their routing on the device and enqueue_step
  // neither waits nor synchronises: a graph of it replays for any spans of the same counts (the kernels read
  // them from device memory). Where `exchange` and step_exchanges() instead, every MoE layer (rings(layer))
  // publishes its rows' x and routing through the exchange's doorbell and waits on the device for the host's
  // answer (each row's sum over the experts the cache lacks), the cached ones added after as the decode program
  // adds them: no wait on the host either, so it is captured and replayed, the Runner answering each ring while it
  // runs. Only a captured step exchanges: enqueued as it is, its hundreds of launches could fill the launch queue
  // while the device waits for an answer the host, still launching, cannot give. Otherwise the host groups each
  // layer's routing, as run() does.
  void stage_step(const RowsSpan* spans, int n_spans, const float* ple_rows);
  void enqueue_step(cudaStream_t s, bool exchange);
  bool step_on_device() const;
  bool step_exchanges() const;
  bool rings(int layer) const;  // a MoE layer: a step that exchanges rings for it
  int max_step_rows() const noexcept;
  const float* step_logits(int row) const;  // device [n_vocab]

  // Where the next run()s write each layer's output at their last row, the mean of its streams, as `strata cvector`
  // measures it (docs/control_vectors.md): device-visible [n_layer][n_embd] floats; null: nowhere (the default).
  void record_layer_states(float* out) noexcept { layer_states_ = out; }

  PromptStats stats() const noexcept;
  void reset_stats() noexcept;

 private:
  struct LayerPath;  // the chunk as the layer recipe's path: its rows (layer_recipe.hpp)
  // Layer `layer`'s control vectors (programs/prompt_rows.cu): the chunk's sequence's, or, in a step, each row's
  // sequence's through the RowsTable where any of the step's sequences steers the layer; empty where none does.
  kernels::StreamAddend steering(int layer) const;
  void project_rows(const float* x, int rows, const Products& products, cudaStream_t s) const;
  void all_logits(int n, float* logits, cudaStream_t s);
  void head_rows(int first, int rows, cudaStream_t s);
  // The rows' tokens, positions and PLE rows into the pinned block; then up to the device, embedded, and every
  // stream started at the embedding.
  void stage_tokens(const int* tokens, const int* positions, int n, const float* ple_rows);
  std::size_t host_layout_rows() const;  // where a step's RowsTable is staged in the pinned block
  void begin_rows(int n, bool ple, cudaStream_t s);
  void run_layers(int rows, int position, bool ahead, cudaStream_t s);
  void ple(int layer, int rows, cudaStream_t s) const;
  // The mixers of layer `layer` over the rows, on its input products (mixer_inputs, layer_recipe.hpp): the chunk's
  // (attention: from `position` on) in the program's sequence, or a step's spans (rows_step_).
  void mixer_gdn(int layer, int rows, const Products& inputs, cudaStream_t s) const;
  void mixer_attention(int layer, int rows, int position, const Products& inputs, cudaStream_t s) const;
  kernels::GdnChunkArgs gdn_args(int layer, int rows, const SequenceViews& views) const;
  void attention_chunk_rows(int layer, int rows, int position, cudaStream_t s) const;
  // A step's mixers and PLE layer over its spans (programs/prompt_rows.cu).
  kernels::StepSpans step_spans() const;
  void gdn_step_rows(int layer, int rows, cudaStream_t s) const;
  void attention_step_rows(int layer, int rows, cudaStream_t s) const;
  void ple_step_rows(int layer, int rows, cudaStream_t s) const;
  kernels::PagedKv stream_in(const SequenceViews& v, int layer, int position, cudaStream_t s) const;
  void stream_out(const SequenceViews& v, int layer, const kernels::PagedKv& buffer, int position, int rows,
                  cudaStream_t s) const;
  void routed_experts(int layer, int rows, cudaStream_t s);
  void cached_pair_rows(int layer, int rows, cudaStream_t s) const;
  void cached_sum(int rows, bool accumulate, cudaStream_t s) const;
  const CachedLayer* cached(int layer) const;
  void publish_rows(int layer, int rows, cudaStream_t s) const;
  void exchanged_rows(int layer, int rows, cudaStream_t s) const;

  const ModelGeometry& g_;
  const ModelTensors& t_;
  SequenceViews seq_;
  SequenceViews offsets_;  // any arena of the sequence's layout as offsets (a step's spans); empty when streaming
  kernels::EmbedTable embedding_;
  kernels::AttentionShape attention_;
  const float *rope_cos_, *rope_sin_;
  int* history_;  // the sequence's every token fed, for the repetition penalty
  const Steering* steering_;  // the sequence's control vectors
  int chunk_;
  DeviceBuffer scratch_;
  PinnedMapped host_;            // tokens and positions, PLE rows, staged for the copies
  float* ones_ = nullptr;        // [hc] unit injection weights
  ChunkExperts experts_;         // each MoE layer's routed experts
  ChunkExpertRows expert_rows_;  // ... on these rows of the scratch
  long fed_tokens_ = 0, chunks_run_ = 0;
  bool row_states_ = false;      // the chunk running keeps each token's recurrent state
  const ExpertCache* cache_;
  bool rows_step_ = false;       // a step of several rows is running: its mixers read its spans
  // The step or short chunk running has every expert in the cache: its pairs run on the device.
  bool device_experts_ = false;
  bool exchanged_experts_ = false;  // ... else through the exchange's doorbell (step_exchanges)
  RowsExchange exchange_;
  int step_rows_ = 0, step_spans_ = 0;  // the staged step's
  bool step_ple_ = false;        // ... has PLE rows
  std::vector<char> step_steers_;  // ... per layer: whether any of its sequences has a control vector there
  float* layer_states_ = nullptr;  // record_layer_states
};

}  // namespace strata
