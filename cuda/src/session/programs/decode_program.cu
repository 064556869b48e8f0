#include "decode_program.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../../kernels/embed.cuh"
#include "../../kernels/gdn.cuh"
#include "../../kernels/gemv.cuh"
#include "../../kernels/hc_read.cuh"
#include "../../kernels/launch.cuh"
#include "../../kernels/moe.cuh"
#include "../../kernels/ple.cuh"
#include "../../kernels/router.cuh"
#include "strata/device.hpp"
#include "layer_recipe.hpp"
#include "../products/mixer_shapes.hpp"
#include "scratch_carver.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// The stage's token lands in the penalty's history at its position.
__global__ void record_token(const TokenStage* stage, int* seen) {
  kernels::await_producers();
  kernels::release_consumers();
  seen[stage->position] = stage->token;
}

// The decode scratch of `g` for a context of `context` tokens, carved out of `c` into `s`: the one definition the
// allocation and the memory plan (DecodeProgram::scratch_bytes) both read. `sample_bytes`: the sampler's.
void carve_scratch(Carver& c, const ModelGeometry& g, int context, std::size_t sample_bytes, DecodeScratch& s) {
  const RowWidths w = row_widths(g);
  const int n = w.n, hc = w.hc, width = w.width, hv = g.ssm_n_v_heads, value_dim = w.value_dim, conv = w.conv;
  const int heads_dim = w.heads_dim, kv_dim = w.kv_dim, max_cols = w.max_cols;
  // QSA scratch for the smallest block of any layer: the most blocks a context has, and the most kept.
  int max_blocks = 0, keep_blocks = 0;
  for (int l = 0; l < static_cast<int>(g.compress_ratios.size()); ++l) {
    if (g.recurrent[l] || g.indexer_head_dim == 0) continue;
    const int ratio = g.compress_ratios[l];
    STRATA_EXPECTS(ratio >= 1 && g.indexer_top_k >= ratio, InvalidArgument,
                   "layer " + std::to_string(l) + ": QSA block of " + std::to_string(ratio) + " tokens with a budget "
                       "of " + std::to_string(g.indexer_top_k) + " tokens; the budget must hold one block or more");
    max_blocks = std::max(max_blocks, context / ratio);
    keep_blocks = std::max(keep_blocks, g.indexer_top_k / ratio);
  }
  const kernels::AttentionShape attention = attention_shape(g);
  const std::size_t attention_partials =
      g.attention_layers() > 0 ? kernels::attention_decode_partial_floats(attention) : 0;
  char* stage = c.take<char>(DecodeProgram::stage_bytes(g));
  s.stage_ = reinterpret_cast<TokenStage*>(stage);
  s.ple_rows_ = stage ? reinterpret_cast<float*>(stage + kStagePleOffset) : nullptr;
  s.q8_.xq = c.take<std::int8_t>(max_cols);
  s.q8_.dx = c.take<float>(max_cols / 32 + 1);
  s.q8_.sums = c.take<std::int32_t>(max_cols / 32 + 1);
  s.ones_ = c.take<float>(hc);
  s.x_ = c.take<float>(n);
  s.y_ = c.take<float>(n);
  s.normed_ = c.take<float>(width);
  s.down_ = c.take<float>(g.hc_rank);
  s.up_ = c.take<float>(width);
  s.inject_ = c.take<float>(hc);
  s.hc_rms_ = c.take<float>(hc);
  s.inj_attn_ = c.take<float>(hc);
  s.inj_ffn_ = c.take<float>(2 * hc);
  s.deferred_ = c.take<float>(n);
  s.qkvz_ = c.take<float>(conv + value_dim);
  s.beta_ = c.take<float>(2 * hv);
  s.alpha_ = c.take<float>(hv);
  s.conv_out_ = c.take<float>(conv);
  s.core_ = c.take<float>(value_dim);
  s.qg_ = c.take<float>(2 * heads_dim);
  s.k_ = c.take<float>(kv_dim);
  s.v_ = c.take<float>(kv_dim);
  s.q_ = c.take<float>(heads_dim);
  s.attn_ = c.take<float>(heads_dim);
  s.iq_ = c.take<float>(g.indexer_n_heads * g.indexer_head_dim);
  s.ik_ = c.take<float>(g.indexer_head_dim);
  s.scores_ = c.take<float>(max_blocks);
  s.selected_ = c.take<int>(keep_blocks);
  s.n_selected_ = c.take<int>(1);
  s.attention_partials_ = c.take<float>(attention_partials);
  s.router_logits_ = c.take<float>(g.n_expert);
  s.route_weights_ = c.take<float>(g.n_expert_used);
  s.route_ids_ = c.take<int>(g.n_expert_used);
  s.route_ticket_ = c.take<unsigned>(1);
  const int k = g.n_expert_used, hidden = k * g.expert_ff;
  s.cache_slots_ = c.take<int>(k);
  s.ex_gate_ = c.take<float>(hidden);
  s.ex_up_ = c.take<float>(hidden);
  s.ex_hidden_ = c.take<float>(hidden);
  s.ex_rows_ = c.take<float>(static_cast<std::size_t>(k) * n);
  s.ex_x8_ = {c.take<std::int8_t>(n), c.take<float>(n / 32 + 1), c.take<std::int32_t>(n / 32 + 1)};
  s.ex_hidden8_ = {c.take<std::int8_t>(hidden), c.take<float>(hidden / 32 + 1), c.take<std::int32_t>(hidden / 32 + 1)};
  s.sh_g_ = c.take<float>(g.shared_ff);
  s.sh_u_ = c.take<float>(g.shared_ff);
  s.sh_h_ = c.take<float>(g.shared_ff);
  s.shared_ = c.take<float>(n);
  s.shared_gate_ = c.take<float>(1);
  s.routed_ = c.take<float>(n);
  s.ple_key_ = c.take<float>(width);
  s.ple_value_ = c.take<float>(n);
  s.ple_out_ = c.take<float>(width);
  s.logits_ = c.take<float>(g.n_vocab);
  s.logprobs_ = c.take<kernels::Logprobs>(1);
  s.sample_bias_ = c.take<float>(g.n_vocab);
  s.answer_counts_ = c.take<int>(g.n_vocab);
  s.sample_scratch_bytes_ = sample_bytes;
  s.sample_scratch_ = c.take<char>(sample_bytes);
}

}  // namespace

std::size_t DecodeProgram::stage_bytes(const ModelGeometry& g) {
  return kStagePleOffset + sizeof(float) * std::max(g.ple_n_heads * g.ple_head_dim, 1);
}

std::size_t DecodeProgram::scratch_bytes(const ModelGeometry& g, int context, std::size_t sampler_bytes) {
  DecodeScratch s;
  Carver sizing(nullptr);
  carve_scratch(sizing, g, context, sampler_bytes, s);
  return sizing.used();
}

DecodeProgram::DecodeProgram(const ModelGeometry& g, const ProgramInputs& in, int device, const ProgramIo& io,
                             const ExpertCache* cache)
    : g_(g),
      t_(*in.tensors),
      embedding_(in.embedding),
      io_(io),
      cache_(cache),
      seq_(in.sequence),
      context_(seq_.context),
      attention_(in.attention),
      cos_(in.rope_cos),
      sin_(in.rope_sin),
      seen_(in.history),
      steering_(in.steering),
      scratch_(0) {
  std::size_t sample_bytes = 0;
  STRATA_CUDA_TRY(kernels::sample_scratch_bytes(g.n_vocab, &sample_bytes));
  Carver sizing(nullptr);
  carve_scratch(sizing, g, context_, sample_bytes, *this);
  require_free_memory(sizing.used(), device, "the decode scratch would", "a shorter context needs less");
  scratch_ = DeviceBuffer(sizing.used());
  Carver real(scratch_.as<char>());
  carve_scratch(real, g, context_, sample_bytes, *this);
  const int hc = std::max(g.hc_count, 1);

  // The unit injection weights of one-stream writes.
  const std::vector<float> ones(hc, 1.0f);
  STRATA_CUDA_TRY(cudaMemcpy(ones_, ones.data(), sizeof(float) * hc, cudaMemcpyHostToDevice));
  // A routed slot the cache does not hold leaves its gate/up rows as an earlier token wrote them; the hidden
  // rows computed from them are never read, but must be finite numbers to quantize: zero before the first.
  const std::size_t hidden_bytes = sizeof(float) * g.n_expert_used * g.expert_ff;
  STRATA_CUDA_TRY(cudaMemset(ex_gate_, 0, hidden_bytes));
  STRATA_CUDA_TRY(cudaMemset(ex_up_, 0, hidden_bytes));
  STRATA_CUDA_TRY(cudaMemset(route_ticket_, 0, sizeof(unsigned)));  // every router launch leaves it zero again
  STRATA_CUDA_TRY(cudaMemset(answer_counts_, 0, sizeof(int) * g.n_vocab));  // every draw leaves them zero again
  for (int l = 0; l < g.ple_layer; ++l) ple_late_ = ple_late_ || rings(l);
}

void DecodeProgram::begin(cudaStream_t s) const {
  const std::size_t staged = ple_late_ ? sizeof(TokenStage) : stage_bytes(g_);
  STRATA_CUDA_TRY(cudaMemcpyAsync(stage_, io_.host_stage, staged, cudaMemcpyHostToDevice, s));
  STRATA_CUDA_TRY(kernels::launch(record_token, 1, 1, 0, s, stage_, seen_));
  STRATA_CUDA_TRY(kernels::embed_rows(embedding_, &stage_->token, 1, x_, s));
  const int hc = std::max(g_.hc_count, 1);
  STRATA_CUDA_TRY(cudaMemsetAsync(seq_.streams, 0, sizeof(float) * hc * g_.n_embd, s));
  add_to_streams(seq_.streams, ones_, 0, x_, 1, hc, g_.n_embd, s);  // every stream = the embedding
}

// The token as the layer recipe's path: one row; each activation's producer writes its q8_32 form where a
// product reads it, and the GEMVs of one input run side by side (Branches).
struct DecodeProgram::LayerPath {
  static constexpr int rows = 1;
  const DecodeProgram& program;
  const DecodeScratch& buffers = program;

  const ModelGeometry& geometry() const { return program.g_; }
  const ModelTensors& tensors() const { return program.t_; }
  float* streams() const { return program.seq_.streams; }
  const float* ones() const { return program.ones_; }
  float* ffn_injection(int layer) const { return program.ffn_injection(layer); }
  Q8Scratch q8_beside(const Products& readers) const { return q8_for(readers, program.q8_); }
  void project(const float* x, const Products& products, cudaStream_t s) const {
    strata::project(x, products, program.q8_, s, &program.branches_);
  }
  void project_produced(const float* x, const Products& products, cudaStream_t s) const {
    project_quantized(x, products, program.q8_, s, &program.branches_);
  }
  void quantize_for(const float* x, const Products& readers, cudaStream_t s) const {
    strata::quantize_for(x, readers, program.q8_, s);
  }
  bool hc_read_fused(const float* streams, const HcTensors& t, float* x, float* inj, const Products& readers,
                     cudaStream_t s) const {
    return program.hc_read_fused(streams, t, x, inj, readers, s);
  }
  void ple(int layer, cudaStream_t s) const { program.ple(layer, s); }
  void mixer_gdn(int layer, const Products& inputs, cudaStream_t s) const { program.mixer_gdn(layer, inputs, s); }
  void mixer_attention(int layer, const Products& inputs, cudaStream_t s) const {
    program.mixer_attention(layer, inputs, s);
  }
  void route(int layer, cudaStream_t s) const { program.route(layer, s); }
  // The experts the cache holds, while the host computes the others.
  void beside_routed(int layer, cudaStream_t s) const {
    if (const CachedLayer* c = program.cached(layer)) program.cached_experts(*c, s);
  }
  void routed_rows(int layer, cudaStream_t s) const { program.routed_rows(layer, s); }
  // Layer - 1's deferred row, which came with this layer's answer, with the write-back weights of its own layer.
  void late_rows(int layer, cudaStream_t s) const {
    if (program.takes_deferred(layer)) write_streams(*this, program.ffn_injection(layer - 1), program.deferred_, s);
  }
  // The layer's vector, baked into post(layer) where it is captured: the runner drops its graphs when a layer gains
  // or loses one.
  kernels::StreamAddend steering(int layer) const { return {program.steering_->vector(layer), nullptr, 0}; }
};

bool DecodeProgram::hc_read_fused(const float* streams, const HcTensors& t, float* x, float* inj,
                                  const Products& readers, cudaStream_t s) const {
  const kernels::HcReadShape shape{g_.hc_count, g_.n_embd, g_.hc_rank, g_.rms_eps};
  const kernels::WeightMatrix down = weight_matrix(*t.down), up = weight_matrix(*t.up);
  const kernels::WeightMatrix inject = inj ? weight_matrix(*t.inject) : kernels::WeightMatrix{};
  const kernels::WeightMatrix* p_inject = inj ? &inject : nullptr;
  if (!kernels::hc_read_fusable(shape, down, up, p_inject)) return false;
  // Hn where the chain keeps it: normed_ and the q8_32 scratch, which hc_read_up_mix then fills with x's form.
  const kernels::HcReadStage stage{normed_, q8_};
  STRATA_CUDA_TRY(kernels::hc_read_down(shape, streams, t.norm, down, p_inject, stage, down_, inj, hc_rms_, s));
  STRATA_CUDA_TRY(kernels::hc_read_up_mix(shape, streams, t.norm, hc_rms_, down_, up, x, q8_for(readers, q8_), s));
  return true;
}

void DecodeProgram::ple(int layer, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  if (ple_late_) {  // behind the wait for a ring below: the host wrote the rows before answering it
    const char* rows = static_cast<const char*>(io_.host_stage) + kStagePleOffset;
    STRATA_CUDA_TRY(cudaMemcpyAsync(ple_rows_, rows, sizeof(float) * g_.ple_n_heads * g_.ple_head_dim,
                                    cudaMemcpyHostToDevice, s));
  }
  project(ple_rows_, {{t.ple_key, ple_key_}, {t.ple_value, ple_value_}}, q8_, s, &branches_);
  const kernels::PleShape shape = ple_shape(g_);
  kernels::PleStepArgs args = ple_layer_args(t, seq_);
  args.streams = seq_.streams;
  args.key = ple_key_;
  args.value = ple_value_;
  args.out = ple_out_;
  STRATA_CUDA_TRY(kernels::ple_step(shape, args, s));
  add_to_streams(seq_.streams, ones_, 0, ple_out_, 1, 1, g_.hc_count * g_.n_embd, s);
}

void DecodeProgram::mixer_gdn(int layer, const Products& inputs, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  float* z = gdn_z(g_, t, qkvz_, 1);
  project_quantized(x_, inputs, q8_, s, &branches_);
  const Products output{{t.ssm_out, y_}};
  const kernels::GdnShape shape = gdn_shape(g_);
  kernels::GdnStepArgs args = gdn_layer_args(t, seq_, layer);
  args.qkv = qkvz_;
  args.z = z;
  args.beta_in = beta_;
  args.alpha_in = alpha_;
  args.conv_out = conv_out_;
  args.out = core_;
  args.out_q8 = q8_for(output, q8_);  // the gated norm writes core_'s q8_32 form: no quantize before ssm_out
  STRATA_CUDA_TRY(kernels::gdn_step(shape, args, s));
  project_quantized(core_, output, q8_, s);
}

void DecodeProgram::mixer_attention(int layer, const Products& inputs, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  const int* position = &stage_->position;
  project_quantized(x_, inputs, q8_, s, &branches_);
  const Products output{{t.o, y_}};
  kernels::AttentionPrepArgs prep = attention_prep_args(t, cos_, sin_, qg_, k_, v_, q_);
  prep.position = position;
  // Streaming: row p's block into the window before prep writes it there (sequence_views: kv is the window).
  if (seq_.kv_streaming) STRATA_CUDA_TRY(kernels::kv_window_claim(seq_.window[layer], position, s));
  STRATA_CUDA_TRY(kernels::attention_prep(attention_, prep, seq_.kv[layer], s));
  kernels::AttentionDecodeArgs decode;
  decode.q = q_;
  decode.q_gate = qg_;
  decode.position = position;
  decode.out = attn_;
  decode.out_q8 = q8_for(output, q8_);  // the merge writes attn_'s q8_32 form: no quantize before attn_output
  kernels::carve_attention_partials(attention_, attention_partials_, decode);
  if (t.index_q) {
    const kernels::IndexerShape& shape = seq_.index_shape[layer];
    STRATA_CUDA_TRY(kernels::qsa_append(shape, seq_.index_cache[layer], ik_, t.index_k_norm, cos_, sin_, position, s));
    kernels::IndexerSelectArgs select =
        indexer_select_args(t, cos_, sin_, iq_, scores_, selected_, n_selected_);
    select.position = position;
    STRATA_CUDA_TRY(kernels::qsa_select(shape, seq_.index_cache[layer], select, s));
    if (seq_.kv_streaming) {  // row p back to the host copy, the selected blocks into the window
      STRATA_CUDA_TRY(kernels::kv_window_fill(seq_.window[layer], selected_, n_selected_, position, s));
    }
    decode.selected_blocks = selected_;
    decode.n_selected = n_selected_;
    decode.block_tokens = shape.ratio;
  }
  STRATA_CUDA_TRY(kernels::attention_decode(attention_, decode, seq_.kv[layer], s));
  project_quantized(attn_, output, q8_, s);
}

void DecodeProgram::pre(int layer, cudaStream_t s) const { layer_to_handoff(LayerPath{*this}, layer, s); }

// Router, then the ring: the host starts on the routed experts the cache lacks while the shared expert and the
// cached ones run here. One launch: the GEMV, the top k, the cache slots and the publish. The read wrote x's q8_32
// form for every reader of it (ffn_inputs): the router and the shared expert take it as it is.
void DecodeProgram::route(int layer, cudaStream_t s) const {
  const LayerTensors& t = t_.layers[layer];
  const CachedLayer* c = cached(layer);
  const kernels::RouteTargets route{router_logits_, route_ids_, route_weights_, c ? c->slot_of : nullptr,
                                    cache_slots_, route_ticket_};
  kernels::RoutePublish publish;
  publish.ring = rings(layer);
  publish.bell = io_.bell;
  publish.ring_base = io_.ring_base;
  publish.ring_offset = layer + 1;
  route_and_publish(*t.router, x_, q8_, g_.n_expert_used, route, publish, s);
  const DecodeScratch& buffers = *this;
  project_quantized(x_, shared_inputs(t, buffers), q8_, s, &branches_);
}

const CachedLayer* DecodeProgram::cached(int layer) const {
  if (!cache_ || layer >= cache_->layers() || cache_->slots(layer) == 0) return nullptr;
  return &cache_->layer(layer);
}

bool DecodeProgram::rings(int layer) const { return layer_rings(cache_, layer); }

// The routed slots the cache holds, as one batch per matrix (the slots it lacks are skipped on the device):
// ex_rows_[j] = down_j(silu(gate_j x) * up_j x), unweighted, as the pool computes its rows.
void DecodeProgram::cached_experts(const CachedLayer& c, cudaStream_t s) const {
  const int k = g_.n_expert_used, ff = g_.expert_ff;
  if (reads_q8(c.gate) || reads_q8(c.up)) quantize(x_, g_.n_embd, ex_x8_, s);
  const kernels::MatrixBatch inputs{cache_slots_, k, 0, kernels::side_by_side_split(ff, k)};
  branches_.run(2, s, [&](int i, cudaStream_t side) {
    project_batch(i == 0 ? c.gate : c.up, inputs, x_, ex_x8_, i == 0 ? ex_gate_ : ex_up_, side);
  });
  STRATA_CUDA_TRY(kernels::swiglu(ex_gate_, ex_up_, ex_hidden_, k * ff, s, q8_for(c.down, ex_hidden8_)));
  project_batch(c.down, {cache_slots_, k, ff, kernels::side_by_side_split(g_.n_embd, k)}, ex_hidden_, ex_hidden8_,
                ex_rows_, s);
}

void DecodeProgram::post(int layer, cudaStream_t s) const { layer_from_handoff(LayerPath{*this}, layer, s); }

void DecodeProgram::routed_rows(int layer, cudaStream_t s) const {
  const bool ring = rings(layer);
  if (ring) {
    const bool deferred = takes_deferred(layer);
    STRATA_CUDA_TRY(kernels::doorbell_wait(io_.bell, io_.ring_base, layer + 1, io_.answer_timeout_ns,
                                           io_.wait_status, routed_, s, deferred ? (layer - 1) % 2 : -1,
                                           deferred ? deferred_ : nullptr));
  }
  if (cached(layer)) {
    STRATA_CUDA_TRY(kernels::moe_cached_sum(ex_rows_, cache_slots_, route_weights_, 1, g_.n_expert_used, g_.n_embd,
                                            ring, routed_, s));
  }
}

void DecodeProgram::enqueue_logprobs(int token, int n, bool masked, cudaStream_t s) const {
  STRATA_CUDA_TRY(kernels::logprobs(logits_, g_.n_vocab, token, n, masked ? io_.token_mask : nullptr, logprobs_, s));
}

void DecodeProgram::upload_bias(const float* dense, cudaStream_t s) const {
  STRATA_CUDA_TRY(cudaMemcpyAsync(sample_bias_, dense, sizeof(float) * g_.n_vocab, cudaMemcpyHostToDevice, s));
}

void DecodeProgram::end_prompt(Sampler sampler, cudaStream_t s) const {
  STRATA_CUDA_TRY(cudaMemcpyAsync(stage_, io_.host_stage, sizeof(TokenStage), cudaMemcpyHostToDevice, s));
  end(sampler, s);
}

void DecodeProgram::end(Sampler sampler, cudaStream_t s) const {
  const Products head{{t_.head, logits_}};
  read_streams(LayerPath{*this}, seq_.streams, t_.output_hc, t_.output_norm, x_, nullptr, head, s);
  project_quantized(x_, head, q8_, s);
  sample(sampler, s);
}

void DecodeProgram::adopt_logits(const float* row, Sampler sampler, cudaStream_t s) const {
  STRATA_CUDA_TRY(cudaMemcpyAsync(stage_, io_.host_stage, sizeof(TokenStage), cudaMemcpyHostToDevice, s));
  STRATA_CUDA_TRY(cudaMemcpyAsync(logits_, row, sizeof(float) * g_.n_vocab, cudaMemcpyDeviceToDevice, s));
  sample(sampler, s);
}

void DecodeProgram::sample(Sampler sampler, cudaStream_t s) const {
  if (sampler == Sampler::kNone) return;
  // The argmax needs no sort: the host chose it from the values it staged (kernels::picks_argmax).
  auto* draw = sampler == Sampler::kArgmax ? kernels::sample_argmax : kernels::sample_token;
  const kernels::SampleInputs inputs{io_.token_mask, sample_bias_, answer_counts_, io_.mask_published};
  STRATA_CUDA_TRY(draw(logits_, g_.n_vocab, seen_, context_, &stage_->sampling, inputs, sample_scratch_,
                       sample_scratch_bytes_, io_.sampled, s));
}

}  // namespace strata
