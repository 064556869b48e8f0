// A step of several rows on the prompt program (docs/rows.md): spans of consecutive tokens, each of its own
// sequence, through the layer recipe at once; the mixers and the PLE layer one launch a layer for every row, each
// row's state through its span's arena (kernels/state_spans.cuh), the spans read from device memory.
#include <algorithm>
#include <string>
#include <vector>

#include "../../kernels/attention.cuh"
#include "../../kernels/doorbell.cuh"
#include "../../kernels/gdn_chunk.cuh"
#include "../../kernels/gemv.cuh"
#include "../../kernels/launch.cuh"
#include "../../kernels/moe.cuh"
#include "../../kernels/ple.cuh"
#include "../../kernels/qsa.cuh"
#include "../products/mixer_shapes.hpp"
#include "prompt_program.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// Each row's token joins its sequence's seen ids at its position (read on the device, so a captured step records
// each replay's).
__global__ void record_rows(const int* tokens, const int* positions, const RowsTable* table, int rows) {
  kernels::await_producers();
  kernels::release_consumers();
  const int r = threadIdx.x;
  if (r < rows) table->seen[r][positions[r]] = tokens[r];
}

}  // namespace

int PromptProgram::max_step_rows() const noexcept { return seq_.kv_streaming ? 0 : std::min(chunk_, kMaxStepRows); }

bool PromptProgram::step_on_device() const {
  if (!cache_) return false;
  for (int layer = 0; layer < g_.n_layer; ++layer) {
    if (!cache_->holds_all(layer)) return false;
  }
  return true;
}

bool PromptProgram::step_exchanges() const { return exchange_.bell.x != nullptr && !step_on_device(); }

bool PromptProgram::rings(int layer) const { return t_.layers[layer].router != nullptr; }

const float* PromptProgram::step_logits(int row) const { return logits_ + static_cast<std::size_t>(row) * g_.n_vocab; }

void PromptProgram::stage_step(const RowsSpan* spans, int n_spans, const float* ple_rows) {
  const int most = max_step_rows();
  STRATA_EXPECTS(most > 0, InvalidArgument,
                 "a step of several rows reads each sequence's state in one VRAM arena; this one streams its KV");
  STRATA_EXPECTS(n_spans >= 1 && n_spans <= most, InvalidArgument,
                 "a step holds 1.." + std::to_string(most) + " spans, got " + std::to_string(n_spans));
  RowsTable* table = host_.host<RowsTable>(host_layout_rows());
  std::vector<int> tokens, positions;
  step_steers_.assign(g_.n_layer, 0);
  for (int i = 0; i < n_spans; ++i) {
    const RowsSpan& span = spans[i];
    const int rows = static_cast<int>(tokens.size());
    STRATA_EXPECTS(span.state.first == rows && span.state.count >= 1 && rows + span.state.count <= most,
                   InvalidArgument,
                   "span " + std::to_string(i) + " of the step covers rows " + std::to_string(span.state.first) + ".." +
                       std::to_string(span.state.first + span.state.count - 1) + "; spans follow one another from " +
                       "row 0, at most " + std::to_string(most) + " rows in all");
    table->spans[i] = span.state;
    const float* steering = span.steering ? span.steering->table() : nullptr;
    for (int l = 0; steering && l < g_.n_layer; ++l) step_steers_[l] |= span.steering->steers(l) ? 1 : 0;
    for (int j = 0; j < span.state.count; ++j) {
      table->span_of[rows + j] = i;
      table->seen[rows + j] = span.seen;
      table->steering[rows + j] = steering;
      tokens.push_back(span.tokens[j]);
      positions.push_back(span.position + j);
    }
  }
  step_rows_ = static_cast<int>(tokens.size());
  step_spans_ = n_spans;
  step_ple_ = ple_rows != nullptr;
  stage_tokens(tokens.data(), positions.data(), step_rows_, ple_rows);
}

void PromptProgram::enqueue_step(cudaStream_t s, bool exchange) {
  STRATA_EXPECTS(step_rows_ > 0, InvalidArgument, "a step of several rows is enqueued after it is staged");
  const int rows = step_rows_;
  device_experts_ = step_on_device();
  exchanged_experts_ = exchange && step_exchanges();
  const bool ahead = !device_experts_ && !exchanged_experts_ && experts_.begin_chunk(rows);
  rows_step_ = true;
  try {
    begin_rows(rows, step_ple_, s);
    STRATA_CUDA_TRY(cudaMemcpyAsync(rows_table_, host_.host<RowsTable>(host_layout_rows()), sizeof(RowsTable),
                                    cudaMemcpyHostToDevice, s));
    STRATA_CUDA_TRY(kernels::launch(record_rows, 1, kMaxStepRows, 0, s, tokens_, positions_,
                                    static_cast<const RowsTable*>(rows_table_), rows));
    run_layers(rows, 0, ahead, s);
    head_rows(0, rows, s);  // one product over the rows: the head's weights read once for the step
  } catch (...) {
    rows_step_ = device_experts_ = exchanged_experts_ = false;
    throw;
  }
  rows_step_ = device_experts_ = exchanged_experts_ = false;
}

// A step's layer adds each row's own vector where any of its sequences steers the layer: the others' rows read
// their table's zeros there, or, without a table, nothing. Which layers take the table is baked into a captured
// step, whose key names each span's steered set (Steering::generation).
kernels::StreamAddend PromptProgram::steering(int layer) const {
  if (!rows_step_) return {steering_->vector(layer), nullptr, 0};
  if (!step_steers_[layer]) return {};
  return {nullptr, rows_table_->steering, static_cast<long>(layer) * g_.n_embd};
}

kernels::StepSpans PromptProgram::step_spans() const {
  return {rows_table_->spans, rows_table_->span_of, step_spans_};
}

void PromptProgram::gdn_step_rows(int layer, int rows, cudaStream_t s) const {
  kernels::GdnChunkArgs args = gdn_args(layer, rows, offsets_);
  args.state_rows = offsets_.rows.gdn_state[layer];
  args.conv_rows = offsets_.rows.gdn_conv[layer];
  args.row_stride = offsets_.rows.stride;
  args.spans = step_spans();
  STRATA_CUDA_TRY(kernels::gdn_chunk(gdn_shape(g_), args, s));
}

void PromptProgram::ple_step_rows(int layer, int rows, cudaStream_t s) const {
  kernels::PleStepArgs args = ple_layer_args(t_.layers[layer], offsets_);
  args.streams = streams_;
  args.key = ple_key_;
  args.value = ple_value_;
  args.out = ple_out_;
  args.history_rows = offsets_.rows.ple_history;
  args.row_stride = offsets_.rows.stride;
  STRATA_CUDA_TRY(kernels::ple_chunk(ple_shape(g_), args, rows, s, step_spans()));
}

// The decode program's attention (and QSA) over the rows, each row one query at its own position against its own
// sequence's caches: every row's k and v into its cache first, then the QSA keys and their blocks, each row's
// selection of the blocks complete at its position, and its flash-decoding split and merge.
void PromptProgram::attention_step_rows(int layer, int rows, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  const kernels::StepSpans spans = step_spans();
  const kernels::AttentionRows at{positions_, spans, rows};
  const kernels::AttentionPrepArgs prep = attention_prep_args(t, rope_cos_, rope_sin_, qg_, k_, v_, q_);
  STRATA_CUDA_TRY(kernels::attention_prep_rows(attention_, prep, offsets_.kv[layer], at, s));
  kernels::AttentionDecodeArgs decode;
  decode.q = q_;
  decode.q_gate = qg_;
  decode.out = attn_;
  kernels::carve_attention_partials(attention_, rows_partials_, decode);
  int selection_stride = 0;
  if (t.index_q) {
    const kernels::IndexerShape& shape = offsets_.index_shape[layer];
    const kernels::IndexerCache& cache = offsets_.index_cache[layer];
    const kernels::IndexerRows indexed{positions_, spans, rows};
    STRATA_CUDA_TRY(kernels::qsa_append_rows(shape, cache, ik_, t.index_k_norm, rope_cos_, rope_sin_, indexed, s));
    const kernels::IndexerSelectArgs select =
        indexer_select_args(t, rope_cos_, rope_sin_, iq_, rows_scores_, selected_, n_selected_);
    STRATA_CUDA_TRY(
        kernels::qsa_select_rows(shape, cache, select, g_.indexer_n_heads * g_.indexer_head_dim, indexed, s));
    decode.selected_blocks = selected_;
    decode.n_selected = n_selected_;
    decode.block_tokens = shape.ratio;
    selection_stride = shape.keep_blocks;
  }
  STRATA_CUDA_TRY(kernels::attention_decode_rows(attention_, decode, selection_stride, offsets_.kv[layer], at, s));
}

// Every routed (row, expert) pair of the rows from its cache slot, as the decode program runs a token's cached
// experts: GEMV batches over the pairs, each reading its own slot's matrices (a pair's x is its row's) into
// ex_rows_ (a pair whose expert the cache lacks is skipped on the device). No host round trip: the slots come from
// the routing on the device.
void PromptProgram::cached_pair_rows(int layer, int rows, cudaStream_t s) const {
  const CachedLayer& c = cache_->layer(layer);
  const int k = g_.n_expert_used, ff = g_.expert_ff, n = g_.n_embd, pairs = rows * k;
  STRATA_CUDA_TRY(kernels::cache_slots(c.slot_of, route_ids_, pairs, pair_slots_, s));
  STRATA_CUDA_TRY(kernels::gather_rows(x_, pair_row_, pairs, n, ex_x_, s));
  if (reads_q8(c.gate) || reads_q8(c.up)) quantize(ex_x_, static_cast<long>(pairs) * n, ex_x8_, s);
  const kernels::MatrixBatch inputs{pair_slots_, pairs, n, kernels::side_by_side_split(ff, k)};
  project_batch(c.gate, inputs, ex_x_, ex_x8_, ex_gate_, s);
  project_batch(c.up, inputs, ex_x_, ex_x8_, ex_up_, s);
  STRATA_CUDA_TRY(kernels::swiglu(ex_gate_, ex_up_, ex_hidden_, pairs * ff, s, q8_for(c.down, ex_h8_)));
  project_batch(c.down, {pair_slots_, pairs, ff, kernels::side_by_side_split(n, k)}, ex_hidden_, ex_h8_, ex_rows_,
                s);
}

// Each row's weighted sum of its cached pairs' rows (cached_pair_rows), added to what routed_ holds (`accumulate`)
// or in its place.
void PromptProgram::cached_sum(int rows, bool accumulate, cudaStream_t s) const {
  STRATA_CUDA_TRY(kernels::moe_cached_sum(ex_rows_, pair_slots_, route_weights_, rows, g_.n_expert_used, g_.n_embd,
                                          accumulate, routed_, s));
}

// Where the cache holds a layer's experts (some of its slots), null where it holds none.
const CachedLayer* PromptProgram::cached(int layer) const {
  if (!cache_ || layer >= cache_->layers() || cache_->slots(layer) == 0) return nullptr;
  return &cache_->layer(layer);
}

// A step whose cache lacks some experts hands them to the host through the doorbell: the rows' x and routing
// published under one ring right after the routing (the host computes while the GPU runs the shared expert and the
// cached pairs), the ring the layer's as a decode token's, ring_at(base, layer + 1), the step's base staged before
// each launch.
void PromptProgram::publish_rows(int layer, int rows, cudaStream_t s) const {
  const RowsExchange& e = exchange_;
  STRATA_CUDA_TRY(kernels::doorbell_publish(e.bell, x_, route_ids_, route_weights_, e.ring_base, layer + 1, s, rows));
}

// ... and at the hand-off the host's answer (each row's sum over the experts the cache lacks, in slot order:
// ExpertPool::run_rows_sum) waited for on the device into the rows' routed sums, the cached pairs added after: each
// row's sum as the decode program makes its token's (the pool's part, then the cache's).
void PromptProgram::exchanged_rows(int layer, int rows, cudaStream_t s) const {
  const RowsExchange& e = exchange_;
  STRATA_CUDA_TRY(kernels::doorbell_wait_rows(e.bell, e.ring_base, layer + 1, e.timeout_ns, e.status, rows, routed_, s));
  if (cached(layer)) cached_sum(rows, true, s);
}

}  // namespace strata
