#include "prompt_program.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/embed.cuh"
#include "../../kernels/gdn.cuh"
#include "../../kernels/launch.cuh"
#include "../../kernels/attention_chunk.cuh"
#include "../../kernels/gdn_chunk.cuh"
#include "../../kernels/qsa_chunk.cuh"
#include "../../kernels/moe.cuh"
#include "../../kernels/ple.cuh"
#include "../../kernels/router.cuh"
#include "layer_recipe.hpp"
#include "../products/mixer_shapes.hpp"
#include "scratch_carver.hpp"
#include "strata/decode_session.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// The largest chunk: its scratch grows with it (about 0.85 MB per token on qwen4exp), and from a few hundred tokens
// on a chunk already reads every expert once, so longer ones gain nothing on PCIe.
constexpr int kMaxChunk = 8192;
// Rows of the LM head per block when every position's logits are asked for: 64 rows of a 248K vocabulary are
// 64 MB of scratch, and the head's product reads its tile of the weight once per block.
constexpr int kLogitRows = 64;

// The pinned block the host stages a chunk in, as byte offsets: tokens then positions (one copy up), a step's
// spans (up), the PLE rows (up).
struct HostLayout {
  std::size_t tokens = 0, rows = 0, ple = 0, total = 0;
};

HostLayout host_layout(const ModelGeometry& g, int chunk) {
  HostLayout h;
  h.rows = (sizeof(int) * 2 * static_cast<std::size_t>(chunk) + 15) / 16 * 16;
  h.ple = h.rows + sizeof(RowsTable);
  h.total = h.ple + sizeof(float) * chunk * std::max(g.ple_n_heads * g.ple_head_dim, 1);
  return h;
}

void carve(Carver& c, const ModelGeometry& g, int chunk, int context, KvStorage kv, bool kv_streaming,
           PromptScratch& s) {
  const std::size_t T = chunk;
  const RowWidths w = row_widths(g);
  const int n = w.n, hc = w.hc, width = w.width, hv = g.ssm_n_v_heads, value_dim = w.value_dim, conv = w.conv;
  const int heads_dim = w.heads_dim, kv_dim = w.kv_dim, ple_width = w.ple_width, max_cols = w.max_cols;
  const std::size_t pairs = T * g.n_expert_used, ff = g.expert_ff;
  // The QSA selections of every query of the chunk, the chunk kernels' scratch and a step's rows' block scores, for
  // the largest indexer.
  std::size_t keep_blocks = 0, qsa_scratch = 0, max_blocks = 0;
  for (int l = 0; l < static_cast<int>(g.compress_ratios.size()); ++l) {
    if (g.recurrent[l] || g.indexer_head_dim == 0) continue;
    const kernels::IndexerShape shape = indexer_shape(g, l, context);
    keep_blocks = std::max<std::size_t>(keep_blocks, shape.keep_blocks);
    qsa_scratch = std::max(qsa_scratch, kernels::qsa_select_chunk_scratch_floats(shape, chunk));
    max_blocks = std::max<std::size_t>(max_blocks, shape.max_blocks);
  }
  const kernels::AttentionShape attention = attention_shape(g);
  s.tokens_ = c.take<int>(2 * T);  // tokens, then positions: one copy up from the host's block
  s.positions_ = s.tokens_ ? s.tokens_ + T : nullptr;
  s.q8_ = {c.take<std::int8_t>(T * max_cols), c.take<float>(T * max_cols / 32),
           c.take<std::int32_t>(T * max_cols / 32)};
  s.streams_ = c.take<float>(T * width);
  s.x_ = c.take<float>(T * n);
  s.y_ = c.take<float>(T * n);
  s.normed_ = c.take<float>(T * width);
  s.down_ = c.take<float>(T * g.hc_rank);
  s.up_ = c.take<float>(T * width);
  s.inject_ = c.take<float>(T * hc);
  s.inj_attn_ = c.take<float>(T * hc);
  s.inj_ffn_ = c.take<float>(T * hc);
  s.qkvz_ = c.take<float>(T * (conv + value_dim));
  s.beta_ = c.take<float>(T * 2 * hv);
  s.alpha_ = c.take<float>(T * hv);
  s.conv_out_ = c.take<float>(T * conv);
  s.core_ = c.take<float>(T * value_dim);
  s.gdn_scratch_ = c.take<float>(g.ssm_n_v_heads > 0 ? kernels::gdn_chunk_scratch_floats(gdn_shape(g), chunk) : 0);
  s.qg_ = c.take<float>(T * 2 * heads_dim);
  s.k_ = c.take<float>(T * kv_dim);
  s.v_ = c.take<float>(T * kv_dim);
  s.q_ = c.take<float>(T * heads_dim);
  s.attn_ = c.take<float>(T * heads_dim);
  s.iq_ = c.take<float>(T * g.indexer_n_heads * g.indexer_head_dim);
  s.ik_ = c.take<float>(T * g.indexer_head_dim);
  s.qsa_scratch_ = c.take<float>(qsa_scratch);
  s.selected_ = c.take<int>(T * keep_blocks);
  s.n_selected_ = c.take<int>(T);
  s.attention_scratch_ =
      c.take<float>(g.attention_layers() > 0 ? kernels::attention_chunk_scratch_floats(attention, chunk) : 0);
  s.router_logits_ = c.take<float>(T * g.n_expert);
  s.route_weights_ = c.take<float>(pairs);
  s.route_ids_ = c.take<int>(pairs);
  s.sh_g_ = c.take<float>(T * g.shared_ff);
  s.sh_u_ = c.take<float>(T * g.shared_ff);
  s.sh_h_ = c.take<float>(T * g.shared_ff);
  s.shared_ = c.take<float>(T * n);
  s.shared_gate_ = c.take<float>(T);
  s.routed_ = c.take<float>(T * n);
  s.row_token_ = c.take<int>(pairs);
  s.row_of_ = c.take<int>(pairs);
  s.group_slot_ = c.take<int>(pairs);          // at most one group per routed row
  s.group_begin_ = c.take<int>(2 * pairs + 1);  // and one begin more per part, of which there are at most as many
  s.ex_x_ = c.take<float>(pairs * n);
  s.ex_x8_ = {c.take<std::int8_t>(pairs * n), c.take<float>(pairs * n / 32), c.take<std::int32_t>(pairs * n / 32)};
  s.ex_gate_ = c.take<float>(pairs * ff);
  s.ex_up_ = c.take<float>(pairs * ff);
  s.ex_hidden_ = c.take<float>(pairs * ff);
  s.ex_h8_ = {c.take<std::int8_t>(pairs * ff), c.take<float>(pairs * ff / 32), c.take<std::int32_t>(pairs * ff / 32)};
  s.ex_rows_ = c.take<float>(pairs * n);
  s.ple_rows_ = c.take<float>(T * ple_width);
  s.ple_key_ = c.take<float>(T * width);
  s.ple_value_ = c.take<float>(T * n);
  s.ple_out_ = c.take<float>(T * width);
  s.logits_ = c.take<float>(static_cast<std::size_t>(std::min(chunk, kLogitRows)) * g.n_vocab);
  s.pair_row_ = c.take<int>(pairs);
  s.pair_slots_ = c.take<int>(pairs);
  const bool streams = kv_streaming && g.attention_layers() > 0;
  s.kv_layer_ = c.take<char>(streams ? kv_half_region_bytes(g, context, kv, false) +
                                           kv_half_region_bytes(g, context, kv, true)
                                     : 0);
  // A step of several rows (a sequence whose KV streams is never one of its spans; the buffers are kept anyway, a
  // few MB beside that sequence's whole layer of KV above).
  const std::size_t R = std::min(chunk, kMaxStepRows);
  s.rows_table_ = c.take<RowsTable>(1);
  s.rows_scores_ = c.take<float>(R * max_blocks);
  s.rows_partials_ = c.take<float>(g.attention_layers() > 0 ? R * kernels::attention_decode_partial_floats(attention)
                                                            : 0);
}

// Whether a chunk from `position` on reads each query's selected blocks gathered rather than scanned: where its
// first query sees more complete blocks than a selection keeps, neighbouring queries read different blocks, and
// each reading its own beats scanning their union.
bool gathers(const kernels::IndexerShape& shape, int position) {
  return (position + 1) / shape.ratio > shape.keep_blocks;
}

// Pages [first, last) of every kv head of both halves from one cache to another of the same layout (identity
// page tables: page p of the logical sequence is physical page p in both).
void copy_kv_pages(const kernels::PagedKv& from, const kernels::PagedKv& to, int first, int last, cudaStream_t s) {
  if (last <= first) return;
  const std::size_t rows = static_cast<std::size_t>(from.page_size) * from.n_head_kv;  // per page
  for (const bool values : {false, true}) {
    const kernels::KvHalf& a = values ? from.values : from.keys;
    const kernels::KvHalf& b = values ? to.values : to.keys;
    const std::size_t code_row = kv_code_bytes(a.codes, from.head_dim);
    const std::size_t scale_row = kv_scale_bytes(a.codes, from.head_dim);
    STRATA_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(b.data) + first * rows * code_row,
                                    static_cast<const char*>(a.data) + first * rows * code_row,
                                    (last - first) * rows * code_row, cudaMemcpyDefault, s));
    if (scale_row == 0) continue;
    STRATA_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<char*>(b.scale) + first * rows * scale_row,
                                    reinterpret_cast<const char*>(a.scale) + first * rows * scale_row,
                                    (last - first) * rows * scale_row, cudaMemcpyDefault, s));
  }
}

void check_chunk(int chunk) {
  STRATA_EXPECTS(chunk >= 1 && chunk <= kMaxChunk, InvalidArgument,
                 "prompt chunk must be 1.." + std::to_string(kMaxChunk) + " tokens, got " + std::to_string(chunk));
}

}  // namespace

std::size_t PromptProgram::scratch_bytes(const ModelGeometry& g, int chunk, int context, KvStorage kv,
                                         bool kv_streaming) {
  check_chunk(chunk);
  PromptScratch s;
  Carver sizing(nullptr);
  carve(sizing, g, chunk, context, kv, kv_streaming, s);
  return sizing.used() + sizeof(float) * std::max(g.hc_count, 1);
}

PromptProgram::PromptProgram(const ModelGeometry& g, const ProgramInputs& in, int device, int chunk,
                             ExpertStaging* staging, const ExpertCache* cache, cpu::ExpertPool* pool,
                             double cpu_share, const RowsExchange& exchange)
    : g_(g),
      t_(*in.tensors),
      seq_(in.sequence),
      offsets_(seq_.kv_streaming ? SequenceViews{} : arena_offsets(g, *in.tensors, *in.layout, seq_.kv_storage)),
      embedding_(in.embedding),
      attention_(in.attention),
      rope_cos_(in.rope_cos),
      rope_sin_(in.rope_sin),
      history_(in.history),
      steering_(in.steering),
      chunk_(chunk),
      scratch_(0),
      host_((check_chunk(chunk), host_layout(g, chunk).total)),
      experts_(g, t_, chunk, staging, cache, pool, cpu_share),
      cache_(cache),
      exchange_(exchange) {
  const std::size_t bytes = scratch_bytes(g, chunk, seq_.context, seq_.kv_storage, seq_.kv_streaming);
  require_free_memory(bytes, device, "the prompt chunk's scratch would", "a smaller prompt chunk needs less");
  scratch_ = DeviceBuffer(bytes);
  Carver real(scratch_.as<char>());
  carve(real, g, chunk, seq_.context, seq_.kv_storage, seq_.kv_streaming, *this);
  ones_ = real.take<float>(std::max(g.hc_count, 1));
  const std::vector<float> ones(std::max(g.hc_count, 1), 1.0f);
  STRATA_CUDA_TRY(cudaMemcpy(ones_, ones.data(), sizeof(float) * ones.size(), cudaMemcpyHostToDevice));
  std::vector<int> pair_row(static_cast<std::size_t>(chunk) * g.n_expert_used);
  for (std::size_t i = 0; i < pair_row.size(); ++i) pair_row[i] = static_cast<int>(i) / g.n_expert_used;
  STRATA_CUDA_TRY(cudaMemcpy(pair_row_, pair_row.data(), sizeof(int) * pair_row.size(), cudaMemcpyHostToDevice));
  // The scratch's rows the routed experts read and write, fixed for the program's life.
  expert_rows_.x = x_;
  expert_rows_.route_ids = route_ids_;
  expert_rows_.route_weights = route_weights_;
  expert_rows_.row_token = row_token_;
  expert_rows_.row_of = row_of_;
  expert_rows_.group_slot = group_slot_;
  expert_rows_.group_begin = group_begin_;
  expert_rows_.ex_x = ex_x_;
  expert_rows_.ex_x8 = ex_x8_;
  expert_rows_.ex_gate = ex_gate_;
  expert_rows_.ex_up = ex_up_;
  expert_rows_.ex_hidden = ex_hidden_;
  expert_rows_.ex_h8 = ex_h8_;
  expert_rows_.ex_rows = ex_rows_;
  expert_rows_.routed = routed_;
  STRATA_EXPECTS(g.attention_layers() == 0 || kernels::attention_chunk_fits(attention_shape(g)), InvalidArgument,
                 "attention: " + std::to_string(g.n_head / std::max(g.n_head_kv, 1)) + " query heads per KV head of " +
                     std::to_string(g.head_dim) + " dims exceed the prompt path's attention kernel on this GPU");
  if (staging) {
    STRATA_EXPECTS(staging->device() == device, InvalidArgument,
                   "the expert staging is on GPU " + std::to_string(staging->device()) + ", the session on GPU " +
                       std::to_string(device));
  }
}

// y_i = W x_i for every row and product: one q8_32 form of the rows shared by the quantized weights (the same
// products' columns, as decode's project() shares one), then one product per weight: for more than kGemvChunkRows
// rows (decode_session.hpp) a tensor-core product that reads each weight tile once per tile of rows; for fewer (a
// short prompt's chunk, a verification's rows, a batch's) multi-input GEMVs of as many rows as the weight's kernel
// takes at once (rows_per_launch: 16 on the tensor cores or for a float weight, 8 otherwise), each weight block
// read and decoded once for all of them, since a tensor-core tile of 64 rows would stream each weight tile through
// a few CTAs for a handful of rows, while the GEMVs spread the matrix over every SM.
void PromptProgram::project_rows(const float* x, int rows, const Products& products, cudaStream_t s) const {
  const long cols = products.begin()->w->cols;
  bool quantized = false;
  for (const Product& p : products) {
    STRATA_EXPECTS(p.w->cols == cols, InvalidArgument, "prompt products of one input differ in columns");
    quantized = quantized || reads_q8(*p.w);
  }
  if (quantized) quantize(x, rows * cols, q8_, s);
  for (const Product& p : products) {
    if (rows > kGemvChunkRows) {
      multiply_rows(*p.w, {rows, static_cast<int>(cols), static_cast<int>(p.w->rows)}, nullptr, x, q8_, p.y, s);
      continue;
    }
    const int per_launch = std::min(rows, rows_per_launch(*p.w));
    for (int first = 0; first < rows; first += per_launch) {
      const long x_at = first * cols;
      project_inputs(*p.w, std::min(per_launch, rows - first), x + x_at, kernels::q8_offset(q8_, x_at),
                     p.y + first * p.w->rows, s);
    }
  }
}

// The rows as the layer recipe's path: each product quantizes its input rows itself (project_rows), so no producer
// writes a q8_32 form beside its floats, and the hyper-connection read is the chain. The mixers and the PLE layer
// read and write the chunk's sequence from `position` on, or a step's spans.
struct PromptProgram::LayerPath {
  PromptProgram& program;
  int rows;
  int position = 0;
  const PromptScratch& buffers = program;

  const ModelGeometry& geometry() const { return program.g_; }
  const ModelTensors& tensors() const { return program.t_; }
  float* streams() const { return program.streams_; }
  const float* ones() const { return program.ones_; }
  float* ffn_injection(int) const { return program.inj_ffn_; }
  Q8Scratch q8_beside(const Products&) const { return {}; }
  void project(const float* x, const Products& products, cudaStream_t s) const {
    program.project_rows(x, rows, products, s);
  }
  void project_produced(const float* x, const Products& products, cudaStream_t s) const { project(x, products, s); }
  void quantize_for(const float*, const Products&, cudaStream_t) const {}
  bool hc_read_fused(const float*, const HcTensors&, float*, float*, const Products&, cudaStream_t) const {
    return false;
  }
  void ple(int layer, cudaStream_t s) const { program.ple(layer, rows, s); }
  void mixer_gdn(int layer, const Products& inputs, cudaStream_t s) const {
    program.mixer_gdn(layer, rows, inputs, s);
  }
  void mixer_attention(int layer, const Products& inputs, cudaStream_t s) const {
    program.mixer_attention(layer, rows, position, inputs, s);
  }
  void route(int layer, cudaStream_t s) const {
    const ModelGeometry& g = geometry();
    project(buffers.x_, ffn_inputs(tensors().layers[layer], buffers), s);
    STRATA_CUDA_TRY(kernels::moe_route(buffers.router_logits_, buffers.route_ids_, buffers.route_weights_, rows,
                                       g.n_expert, g.n_expert_used, s));
    if (program.exchanged_experts_) program.publish_rows(layer, rows, s);  // the host starts while the GPU goes on
  }
  // A step that exchanges: the pairs the cache holds, while the host computes the rest. Otherwise none: the experts
  // the cache holds run in the routing's round trip, grouped with the staged ones.
  void beside_routed(int layer, cudaStream_t s) const {
    if (program.exchanged_experts_ && program.cached(layer)) program.cached_pair_rows(layer, rows, s);
  }
  void routed_rows(int layer, cudaStream_t s) const { program.routed_experts(layer, rows, s); }
  void late_rows(int, cudaStream_t) const {}  // the rows defer no expert
  kernels::StreamAddend steering(int layer) const { return program.steering(layer); }
};

// The PLE layer over the rows: the chunk's, from and into the sequence's history, or a step's (ple_step_rows).
void PromptProgram::ple(int layer, int rows, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  project_rows(ple_rows_, rows, {{t.ple_key, ple_key_}, {t.ple_value, ple_value_}}, s);
  if (rows_step_) {
    ple_step_rows(layer, rows, s);
  } else {
    kernels::PleStepArgs args = ple_layer_args(t, seq_);
    args.streams = streams_;
    args.key = ple_key_;
    args.value = ple_value_;
    args.out = ple_out_;
    if (row_states_) {
      args.history_rows = seq_.rows.ple_history;
      args.row_stride = seq_.rows.stride;
    }
    STRATA_CUDA_TRY(kernels::ple_chunk(ple_shape(g_), args, rows, s));
  }
  add_to_streams(streams_, ones_, 0, ple_out_, rows, 1, g_.hc_count * g_.n_embd, s);
}

void PromptProgram::mixer_gdn(int layer, int rows, const Products& inputs, cudaStream_t s) const {
  project_rows(x_, rows, inputs, s);
  if (rows_step_) {
    gdn_step_rows(layer, rows, s);
  } else {
    kernels::GdnChunkArgs args = gdn_args(layer, rows, seq_);
    if (row_states_) {
      args.state_rows = seq_.rows.gdn_state[layer];
      args.conv_rows = seq_.rows.gdn_conv[layer];
      args.row_stride = seq_.rows.stride;
    }
    STRATA_CUDA_TRY(kernels::gdn_chunk(gdn_shape(g_), args, s));
  }
  project_rows(core_, rows, {{t_.layers[layer].ssm_out, y_}}, s);
}

// The GDN walk over the products of `rows` rows, with layer `layer`'s weights and state in `views`.
kernels::GdnChunkArgs PromptProgram::gdn_args(int layer, int rows, const SequenceViews& views) const {
  const LayerTensors& t = t_.layers[layer];
  const RowWidths w = row_widths(g_);
  const int value_dim = w.value_dim, conv = w.conv, hv = g_.ssm_n_v_heads;
  // qwen3next's merged projection writes rows of [qkv | z]; the split ones write qkv rows, then z rows after
  // every qkv row (gdn_z).
  const bool merged = t.ssm_in != nullptr;
  const long qkv_stride = merged ? conv + value_dim : conv, z_stride = merged ? conv + value_dim : value_dim;
  const long beta_stride = g_.gdn_interleaved_ba ? t.ba->rows : t.beta->rows;
  kernels::GdnChunkArgs args;
  static_cast<kernels::GdnStepArgs&>(args) = gdn_layer_args(t, views, layer);
  args.qkv = qkvz_;
  args.z = gdn_z(g_, t, qkvz_, rows);
  args.beta_in = beta_;
  args.alpha_in = alpha_;  // unread with interleaved_ba
  args.conv_out = conv_out_;
  args.out = core_;
  args.tokens = rows;
  args.qkv_stride = static_cast<int>(qkv_stride);
  args.z_stride = static_cast<int>(z_stride);
  args.beta_stride = static_cast<int>(beta_stride);
  args.alpha_stride = hv;
  args.conv_out_stride = conv;
  args.out_stride = value_dim;
  args.scratch = gdn_scratch_;
  return args;
}

// KV streaming: the chunk's queries together may read any block of the layer, so its whole KV comes from the
// host copy into the chunk's buffer (the rows before the chunk; prep writes the chunk's), and the pages the chunk
// wrote go back after the layer, which leaves the layer's decode window stale: it starts empty again.
kernels::PagedKv PromptProgram::stream_in(const SequenceViews& v, int layer, int position, cudaStream_t s) const {
  const kernels::PagedKv& host = v.window[layer].host;
  kernels::PagedKv buffer = host;
  const std::size_t elements = static_cast<std::size_t>(v.context) * host.n_head_kv * host.head_dim;
  buffer.keys = kernels::kv_half(host.keys.codes, kv_layer_, elements);
  buffer.values = kernels::kv_half(host.values.codes, kv_layer_ + kv_half_bytes(host.keys.codes, elements), elements);
  copy_kv_pages(host, buffer, 0, (position + kKvPageTokens - 1) / kKvPageTokens, s);
  return buffer;
}

void PromptProgram::stream_out(const SequenceViews& v, int layer, const kernels::PagedKv& buffer, int position,
                               int rows, cudaStream_t s) const {
  const kernels::KvWindow& window = v.window[layer];
  copy_kv_pages(buffer, window.host, position / kKvPageTokens, (position + rows - 1) / kKvPageTokens + 1, s);
  STRATA_CUDA_TRY(kernels::kv_window_reset(window, s));
}

void PromptProgram::mixer_attention(int layer, int rows, int position, const Products& inputs,
                                    cudaStream_t s) const {
  project_rows(x_, rows, inputs, s);
  if (rows_step_) attention_step_rows(layer, rows, s);
  else attention_chunk_rows(layer, rows, position, s);
  project_rows(attn_, rows, {{t_.layers[layer].o, y_}}, s);
}

// Attention (and QSA) over the chunk's rows of the products, against the sequence's caches.
void PromptProgram::attention_chunk_rows(int layer, int rows, int position, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  const SequenceViews& v = seq_;
  const bool streamed = v.kv_streaming;  // every attention layer of a streaming session (session_layout.cpp)
  const kernels::PagedKv kv = streamed ? stream_in(v, layer, position, s) : v.kv[layer];
  const int heads_dim = g_.n_head * g_.head_dim, kv_dim = g_.n_head_kv * g_.head_dim;
  const int iq_dim = g_.indexer_n_heads * g_.indexer_head_dim;
  const int* positions = positions_;
  const kernels::AttentionShape& attention = attention_;
  kernels::AttentionChunkPrepArgs prep;
  prep.q_gate = qg_;
  prep.k = k_;
  prep.v = v_;
  prep.q_gate_stride = 2 * heads_dim;
  prep.k_stride = kv_dim;
  prep.v_stride = kv_dim;
  prep.q_norm = t.q_norm;
  prep.k_norm = t.k_norm;
  prep.rope_cos = rope_cos_;
  prep.rope_sin = rope_sin_;
  prep.positions = positions;
  prep.q_out = q_;
  STRATA_CUDA_TRY(kernels::attention_prep_chunk(attention, prep, rows, kv, s));
  kernels::AttentionChunkArgs args;
  args.q = q_;
  args.q_gate = qg_;
  args.q_gate_stride = 2 * heads_dim;
  args.positions = positions;
  args.scratch = attention_scratch_;
  args.out = attn_;
  if (t.index_q) {
    const kernels::IndexerShape& shape = v.index_shape[layer];
    STRATA_CUDA_TRY(kernels::qsa_append_chunk(shape, v.index_cache[layer], ik_,
                                              g_.indexer_head_dim, rows, t.index_k_norm, rope_cos_, rope_sin_,
                                              positions, s));
    kernels::IndexerSelectChunkArgs select;
    select.q = iq_;
    select.q_stride = iq_dim;
    select.q_norm = t.index_q_norm;
    select.rope_cos = rope_cos_;
    select.rope_sin = rope_sin_;
    select.positions = positions;
    select.scratch = qsa_scratch_;
    select.selected_blocks = selected_;
    select.n_selected = n_selected_;
    STRATA_CUDA_TRY(kernels::qsa_select_chunk(shape, v.index_cache[layer], select, rows, s));
    args.selected_blocks = selected_;
    args.n_selected = n_selected_;
    args.selection_stride = shape.keep_blocks;
    args.block_tokens = shape.ratio;
    args.gathered = gathers(shape, position);
  }
  STRATA_CUDA_TRY(kernels::attention_chunk(attention, args, rows, kv, s));
  if (streamed) stream_out(v, layer, kv, position, rows, s);
}

// Layer `layer`'s routed experts over the rows: a step's or a short chunk's from the cache on the device where it
// holds them all (cached_pair_rows), or a step's through the doorbell (exchanged_rows); else grouped by the host
// (experts/chunk_experts.hpp).
void PromptProgram::routed_experts(int layer, int rows, cudaStream_t s) {
  if (device_experts_) {
    cached_pair_rows(layer, rows, s);
    cached_sum(rows, false, s);
  }
  else if (exchanged_experts_) exchanged_rows(layer, rows, s);
  else experts_.run(layer, rows, expert_rows_, s);
}

// The LM head at every row of the chunk, kLogitRows rows at a time into the scratch block and from there into
// `logits` ([n][n_vocab] host floats): the final mixer and the head as decode's end() runs them for one token.
void PromptProgram::all_logits(int n, float* logits, cudaStream_t s) {
  for (int first = 0; first < n; first += kLogitRows) {
    const int rows = std::min(kLogitRows, n - first);
    head_rows(first, rows, s);
    const std::size_t bytes = sizeof(float) * rows * static_cast<std::size_t>(g_.n_vocab);
    STRATA_CUDA_TRY(cudaMemcpyAsync(logits + static_cast<std::size_t>(first) * g_.n_vocab, logits_, bytes,
                                    cudaMemcpyDeviceToHost, s));
    STRATA_CUDA_TRY(cudaStreamSynchronize(s));  // the block is reused for the next rows; logits may be pageable
  }
}

// The final mixer and the LM head at rows first .. first + rows - 1 (at most kLogitRows) into the logits block, as
// decode's end() runs them for one token.
void PromptProgram::head_rows(int first, int rows, cudaStream_t s) {
  const int width = std::max(g_.hc_count, 1) * g_.n_embd;
  const Products head{{t_.head, logits_}};
  read_streams(LayerPath{*this, rows}, streams_ + static_cast<long>(first) * width,
               t_.output_hc, t_.output_norm, x_, nullptr, head, s);
  project_rows(x_, rows, head, s);
}

std::size_t PromptProgram::host_layout_rows() const { return host_layout(g_, chunk_).rows; }

void PromptProgram::stage_tokens(const int* tokens, const int* positions, int n, const float* ple_rows) {
  int* host_tokens = host_.host<int>();
  std::memcpy(host_tokens, tokens, sizeof(int) * n);
  std::memcpy(host_tokens + chunk_, positions, sizeof(int) * n);
  if (ple_rows) {
    std::memcpy(host_.host<float>(host_layout(g_, chunk_).ple), ple_rows,
                sizeof(float) * n * g_.ple_n_heads * g_.ple_head_dim);
  }
}

void PromptProgram::begin_rows(int n, bool ple, cudaStream_t s) {
  const int hc = std::max(g_.hc_count, 1), width = hc * g_.n_embd, emb = g_.n_embd;
  STRATA_CUDA_TRY(cudaMemcpyAsync(tokens_, host_.host<int>(), sizeof(int) * 2 * chunk_, cudaMemcpyHostToDevice, s));
  if (ple) {
    STRATA_CUDA_TRY(cudaMemcpyAsync(ple_rows_, host_.host<float>(host_layout(g_, chunk_).ple),
                                    sizeof(float) * n * g_.ple_n_heads * g_.ple_head_dim, cudaMemcpyHostToDevice, s));
  }
  STRATA_CUDA_TRY(kernels::embed_rows(embedding_, tokens_, n, x_, s));
  STRATA_CUDA_TRY(cudaMemsetAsync(streams_, 0, sizeof(float) * width * n, s));
  add_to_streams(streams_, ones_, 0, x_, n, hc, emb, s);  // every stream = the embedding
}

void PromptProgram::run_layers(int rows, int position, bool ahead, cudaStream_t s) {
  const LayerPath path{*this, rows, position};
  if (ahead) experts_.prefetch_after(-1);
  for (int layer = 0; layer < g_.n_layer; ++layer) {
    // The next staged layer's copy is enqueued as this layer starts: its buffer was released by the layer before
    // this one, so the copy stream runs layer after layer while the layers compute.
    if (ahead) experts_.prefetch_after(layer);
    layer_to_handoff(path, layer, s);
    layer_from_handoff(path, layer, s);
    if (layer_states_) {  // the last row's streams, as the layer left them (its control vectors in them)
      const int hc = std::max(g_.hc_count, 1), n = g_.n_embd;
      STRATA_CUDA_TRY(kernels::hc_stream_mean(streams_ + static_cast<long>(rows - 1) * hc * n, hc, n,
                                              layer_states_ + static_cast<long>(layer) * n, s));
    }
  }
}

void PromptProgram::run(const int* tokens, int n, int position, const float* ple_rows, float* logits,
                        bool row_states, cudaStream_t s) {
  STRATA_EXPECTS(n >= 1 && n <= chunk_, InvalidArgument,
                 "a prompt chunk holds 1.." + std::to_string(chunk_) + " tokens, got " + std::to_string(n));
  STRATA_EXPECTS(!row_states || n <= seq_.rows.count, InvalidArgument,
                 "the sequence keeps row states for " + std::to_string(seq_.rows.count) + " tokens, the chunk has " +
                     std::to_string(n));
  row_states_ = row_states;
  const int width = std::max(g_.hc_count, 1) * g_.n_embd;
  // A short chunk whose routed experts the cache holds whole runs them as a step of rows does: each (row, expert)
  // pair a GEMV from its slot, the routing staying on the device, where the host's grouping takes a round trip a
  // layer and a tensor-core tile of 64 rows for each expert's one or two rows.
  device_experts_ = n <= kGemvChunkRows && step_on_device();
  const bool ahead = !device_experts_ && experts_.begin_chunk(n);
  std::vector<int> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = position + i;
  try {
    stage_tokens(tokens, positions.data(), n, ple_rows);
    begin_rows(n, ple_rows != nullptr, s);
    // The penalty's history of every token fed, as decode's begin() records each.
    STRATA_CUDA_TRY(cudaMemcpyAsync(history_ + position, tokens_, sizeof(int) * n, cudaMemcpyDeviceToDevice, s));
    run_layers(n, position, ahead, s);
  } catch (...) {
    device_experts_ = false;
    throw;
  }
  device_experts_ = false;
  if (logits) all_logits(n, logits, s);
  // The last token's streams are where decode's end() and the next token's layers read the sequence's.
  STRATA_CUDA_TRY(cudaMemcpyAsync(seq_.streams, streams_ + static_cast<long>(n - 1) * width, sizeof(float) * width,
                                  cudaMemcpyDeviceToDevice, s));
  ++chunks_run_;
  fed_tokens_ += n;
}

PromptStats PromptProgram::stats() const noexcept {
  const ChunkExpertStats& e = experts_.stats();
  PromptStats p;
  p.tokens = fed_tokens_;
  p.chunks = chunks_run_;
  p.staged_experts = e.staged_experts;
  p.cached_experts = e.cached_experts;
  p.staged_bytes = e.staged_bytes;
  p.pooled_experts = e.pooled_experts;
  return p;
}

void PromptProgram::reset_stats() noexcept {
  fed_tokens_ = chunks_run_ = 0;
  experts_.reset_stats();
}

}  // namespace strata
