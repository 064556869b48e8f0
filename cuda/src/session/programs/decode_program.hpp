// The GPU work of one decode token as enqueue functions over fixed buffers: begin (staging, embedding),
// pre[l] (mixer, router, publish, shared expert, the experts the VRAM cache holds), post[l] (wait, combine, write
// back), end (final mixer, LM head, sampler); pre and post are the layer recipe's two halves over one row
// (layer_recipe.hpp), the doorbell between. A layer whose experts the cache holds whole neither publishes nor
// waits. Every per-token value is read from device memory, so any part can be captured into a CUDA
// graph once and replayed (docs/session.md). Enqueue functions never allocate or synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "../../kernels/attention.cuh"
#include "../../kernels/doorbell.cuh"
#include "../../kernels/embed.cuh"
#include "../../kernels/logprobs.cuh"
#include "../../kernels/qsa.cuh"
#include "../../kernels/sample.cuh"
#include "../../runtime/device_buffer.hpp"
#include "../exchange/expert_deferral.hpp"
#include "../state/sequence_views.hpp"
#include "../weights/decode_tensors.hpp"
#include "program_inputs.hpp"
#include "../products/projection.hpp"
#include "strata/expert_cache.hpp"
#include "token_schedule.hpp"

namespace strata {

// The per-token values the host writes (pinned) before a launch; begin() copies them to the device.
struct TokenStage {
  kernels::SampleParams sampling;
  int token = 0;
  int position = 0;
};
constexpr std::size_t kStagePleOffset = 256;  // PLE rows follow the stage in the same block
static_assert(sizeof(TokenStage) <= kStagePleOffset, "the token's values overlap the PLE rows staged after them");

// Where the program meets the host: staging and the doorbell.
struct ProgramIo {
  const void* host_stage = nullptr;  // pinned, stage_bytes(geometry): TokenStage, then the PLE rows
  kernels::Doorbell bell;
  const int* ring_base = nullptr;    // mapped: this token's ring base
  int* wait_status = nullptr;        // mapped: the ring a device-side wait gave up on
  long long answer_timeout_ns = 0;
  int* sampled = nullptr;            // mapped: the sampled token id
  const unsigned* token_mask = nullptr;  // mapped: the next draw's token mask words (read where its stage says)
  kernels::MaskPublication mask_published;  // mapped: where a mask written after the launch is published
  ExpertDeferral deferral;           // which layers' deferred rows post() adds a layer late (off: none)
};

// The per-token buffers of the decode program, carved out of one allocation (decode_program.cu,
// carve_scratch): a struct of its own so that the memory plan can size them without a program.
struct DecodeScratch {
  Q8Scratch q8_;
  TokenStage* stage_ = nullptr;  // device copy
  float* ple_rows_ = nullptr;
  float* ones_ = nullptr;
  float *x_ = nullptr, *y_ = nullptr, *normed_ = nullptr, *down_ = nullptr, *up_ = nullptr, *inject_ = nullptr;
  float *inj_attn_ = nullptr, *inj_ffn_ = nullptr;  // inj_ffn_: [2][hc], by layer parity (ffn_injection)
  float* deferred_ = nullptr;  // [n] the layer before's deferred experts, as the host answered them
  float* hc_rms_ = nullptr;    // [hc] the streams' inverse RMS, from the fused read's first launch to its second
  float *qkvz_ = nullptr, *beta_ = nullptr, *alpha_ = nullptr, *conv_out_ = nullptr, *core_ = nullptr;
  float *qg_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *attn_ = nullptr, *iq_ = nullptr, *ik_ = nullptr;
  float* scores_ = nullptr;
  int *selected_ = nullptr, *n_selected_ = nullptr;
  float* attention_partials_ = nullptr;  // attention_decode's per-span partials
  float *router_logits_ = nullptr, *route_weights_ = nullptr, *sh_g_ = nullptr, *sh_u_ = nullptr, *sh_h_ = nullptr;
  float *shared_ = nullptr, *shared_gate_ = nullptr, *routed_ = nullptr;
  int* route_ids_ = nullptr;
  unsigned* route_ticket_ = nullptr;  // the fused router's CTAs count themselves here (zero between launches)
  // The cached experts: each routed slot's cache slot (-1: the pool's), gate, up, hidden and down rows [k][...].
  int* cache_slots_ = nullptr;
  float *ex_gate_ = nullptr, *ex_up_ = nullptr, *ex_hidden_ = nullptr, *ex_rows_ = nullptr;
  Q8Scratch ex_x8_, ex_hidden8_;
  float *ple_key_ = nullptr, *ple_value_ = nullptr, *ple_out_ = nullptr;
  float* logits_ = nullptr;
  kernels::Logprobs* logprobs_ = nullptr;
  float* sample_bias_ = nullptr;  // [n_vocab] the logit bias of the draws that set one (upload_bias)
  int* answer_counts_ = nullptr;  // [n_vocab] zero between draws (kernels::SampleInputs::counts)
  void* sample_scratch_ = nullptr;
  std::size_t sample_scratch_bytes_ = 0;
};

class DecodeProgram final : public TokenProgram, private DecodeScratch {
 public:
  // Allocates the scratch on `device`; the program reads the model and the sequence through `in`
  // (program_inputs.hpp), whose tables and sequence outlive it. `cache` (may be null: every routed expert is the
  // pool's) must outlive the program.
  DecodeProgram(const ModelGeometry& geometry, const ProgramInputs& in, int device, const ProgramIo& io,
                const ExpertCache* cache = nullptr);

  // Whether layer `layer` rings the doorbell (some of its experts are the pool's).
  bool rings(int layer) const;

  // Whether the PLE rows come up from the stage at the PLE layer rather than in begin(): where a layer below it
  // rings, so a host that writes them after the launch and before answering that ring is ordered before the
  // copy (the session gathers them there, docs/session.md). Fixed for the program's life, as the graphs are.
  bool ple_rows_late() const noexcept { return ple_late_; }

  // Bytes of the pinned staging block the host writes before each token (ProgramIo::host_stage).
  static std::size_t stage_bytes(const ModelGeometry& g);

  // Bytes of the device scratch a program of `context` tokens (whole KV pages) allocates beside the sampler's
  // `sampler_bytes`: what the memory plan counts. Depends on the context (QSA block scores).
  static std::size_t scratch_bytes(const ModelGeometry& g, int context, std::size_t sampler_bytes);

  int layers() const override { return g_.n_layer; }
  void begin(cudaStream_t s) const override;
  void pre(int layer, cudaStream_t s) const override;
  void post(int layer, cudaStream_t s) const override;
  void end(Sampler sampler, cudaStream_t s) const override;

  const float* logits() const noexcept { return logits_; }

  // The LM head (and `sampler`) after a prompt left its last token's streams in the arena: the stage's sampling
  // values are copied up first, as begin() copies them for a token.
  void end_prompt(Sampler sampler, cudaStream_t s) const;

  // A row of logits another program computed (a batched step's head, docs/batch.md) as this token's: the stage's
  // sampling values copied up, the row into logits(), then `sampler`.
  void adopt_logits(const float* row, Sampler sampler, cudaStream_t s) const;

  // The log-probabilities of `token` and the n most likely ids at the last position, into logprobs(); `masked`:
  // over the tokens the mask words (ProgramIo::token_mask) allow.
  void enqueue_logprobs(int token, int n, bool masked, cudaStream_t s) const;

  // The dense logit bias (host [n_vocab], page-locked) the draws whose stage sets `biased` add, copied on `s`.
  void upload_bias(const float* dense, cudaStream_t s) const;
  const kernels::Logprobs* logprobs() const noexcept { return logprobs_; }

 private:
  struct LayerPath;  // the token as the layer recipe's path: one row (layer_recipe.hpp)
  // x and inj (null: the final mixer) from the streams in the fused read's two launches (kernels/hc_read.cuh),
  // which write x's q8_32 form in q8_ beside it where one of `readers` reads it (q8_for); false, enqueuing
  // nothing, for a form or shape the fusion lacks (the recipe's chain reads them).
  bool hc_read_fused(const float* streams, const HcTensors& t, float* x, float* inj, const Products& readers,
                     cudaStream_t s) const;
  // Layer `layer`'s FFN injection weights: kept per parity so that post(l + 1) still has layer l's for its
  // deferred row after pre(l + 1) wrote its own.
  float* ffn_injection(int layer) const noexcept { return inj_ffn_ + (layer & 1) * g_.hc_count; }
  // The mixers of layer `layer` on its input products (mixer_inputs, layer_recipe.hpp): they start with x_'s q8_32
  // form in q8_ where one of them reads it (q8_for), and end with the mixer's output y_.
  void mixer_gdn(int layer, const Products& inputs, cudaStream_t s) const;
  void mixer_attention(int layer, const Products& inputs, cudaStream_t s) const;
  void ple(int layer, cudaStream_t s) const;
  // The FFN's router launch (its GEMV, the top k, the cache slots and the doorbell's publish), then the shared
  // expert's gate and up.
  void route(int layer, cudaStream_t s) const;
  // routed_: the host's answer where the layer rings (with layer - 1's deferred row where it brings one), plus the
  // cached experts' weighted rows.
  void routed_rows(int layer, cudaStream_t s) const;
  // Whether layer `layer`'s answer brings layer - 1's deferred row (a deferring layer's next one rings).
  bool takes_deferred(int layer) const { return layer > 0 && io_.deferral.defers(layer - 1, cache_); }
  const CachedLayer* cached(int layer) const;  // null where the cache holds none of the layer's experts
  void sample(Sampler sampler, cudaStream_t s) const;  // the sampler over logits_, from the stage's values
  void cached_experts(const CachedLayer& c, cudaStream_t s) const;

  const ModelGeometry& g_;
  const ModelTensors& t_;
  kernels::EmbedTable embedding_;  // token_embd as the row gather reads it
  ProgramIo io_;
  const ExpertCache* cache_;
  SequenceViews seq_;
  int context_;
  kernels::AttentionShape attention_;
  const float *cos_, *sin_;  // the RoPE tables
  int* seen_;                // the sequence's history of every token fed, for the repetition penalty
  const Steering* steering_;  // the sequence's control vectors: a layer's, where it has one, in post(layer)
  bool ple_late_ = false;

  DeviceBuffer scratch_;
  Branches branches_;
};

}  // namespace strata
