// A layer's blocks in their one order, written once over a rows dimension (one row per token) for every path
// through the layers: the decode token runs it with one row, the prompt chunk with its n (docs/session.md,
// docs/prompt.md). Per layer:
//
//   PLE (the PLE layer) -> read -> mixer (GDN or attention) -> write -> read -> FFN: router and the shared
//   expert's gate and up, the shared expert, the work beside the routed experts || hand-off || the routed rows
//   -> combine -> rows that land late -> write
//
// A read is the block's input x from the residual streams (the hyper-connection read with the block's injection
// weights, or with one stream its RMSNorm); a write adds the block's output back. layer_to_handoff() runs up to
// the routed experts' hand-off and layer_from_handoff() after it. Decode runs them as pre[l] and post[l]: its
// router's launch publishes the choice and rings the doorbell, post waits for the host pool's answer. The prompt
// chunk runs one after the other: its hand-off is the routing's round trip (the host groups the chunk's routes by
// expert and schedules them). A path that verifies k draft tokens at once is a third Path with rows = k: the
// chunk's products and mixers over its k rows, this recipe as it is, and either hand-off (the doorbell for k
// rows' routes, or the round trip).
//
// The Path names only what differs between paths: the kernels of a step where one row has a fused kernel and
// rows a product over rows, the chunk's mixer kernels, streamed KV windows, and how an activation meets its
// products. It provides
//   rows; buffers (the rows' scratch, DecodeScratch or PromptScratch: they name their buffers alike);
//   geometry(), tensors(); streams() [rows][hc][n]; ones() [hc] unit weights; ffn_injection(layer) [rows][hc];
//   q8_beside(readers): the q8_32 form a kernel writing an activation fills beside it for its products (none where
//     the products quantize their input themselves); project(x, products, s): x's q8_32 form where they read
//     it, then the products; project_produced(x, products, s): the same where x's producer wrote that form;
//     quantize_for(x, readers, s): that form after a producer that cannot write it;
//   hc_read_fused(streams, hc, x, inj, readers, s): the read in a fused launch, false where the path has none;
//   ple(layer, s), mixer_gdn(layer, inputs, s), mixer_attention(layer, inputs, s);
//   route(layer, s): the router's choice and the shared expert's gate and up (ffn_inputs);
//   beside_routed(layer, s): the GPU's work while the routed experts are handed off;
//   routed_rows(layer, s): the routed experts' weighted rows into buffers.routed_;
//   late_rows(layer, s): rows of an earlier layer added to the streams before this layer's own;
//   steering(layer): the control vectors the layer's last write adds to every stream (docs/control_vectors.md;
//     kernels::StreamAddend), empty where the layer has none, so that its write is then the plain one.
#pragma once

#include <cuda_runtime.h>

#include "../../kernels/hc.cuh"
#include "../../kernels/moe.cuh"
#include "../../kernels/norm.cuh"
#include "../weights/decode_tensors.hpp"
#include "../products/mixer_shapes.hpp"
#include "../products/projection.hpp"
#include "strata/error.hpp"
#include "strata/geometry.hpp"

namespace strata {

// y's rows into the residual streams h [rows][streams][width]: h[r][k] += inj[r * inj_stride + k] * y[r]
// (kernels::hc_write; inj_stride 0: every row's weights are the same [streams]), then each row's `add` (none where
// empty).
inline void add_to_streams(float* h, const float* inj, int inj_stride, const float* y, int rows, int streams,
                           int width, cudaStream_t s, kernels::StreamAddend add = {}) {
  STRATA_CUDA_TRY(kernels::hc_write(h, inj, inj_stride, y, rows, streams, width, s, add));
}

// Where a GDN layer's z rows start in qkvz [rows][...]: beside each row's qkv in a merged projection's [qkv | z]
// rows (qwen3next), after every qkv row where qkv and z are separate weights.
inline float* gdn_z(const ModelGeometry& g, const LayerTensors& t, float* qkvz, int rows) {
  const long conv = row_widths(g).conv;
  return t.ssm_in ? qkvz + conv : qkvz + rows * conv;
}

// The products of layer `layer`'s mixer input x over `rows` rows, into the buffers `b` (DecodeScratch or
// PromptScratch: the programs name their buffers alike). GDN: qkv (with z where merged), z, beta and alpha (one
// interleaved ba where the variant has it); attention: q with its gate, k, v, and the QSA indexer's q and k.
template <class Buffers>
Products mixer_inputs(const ModelGeometry& g, const LayerTensors& t, int layer, int rows, const Buffers& b) {
  if (!g.recurrent[layer]) {
    if (t.index_q) return {{t.q, b.qg_}, {t.k, b.k_}, {t.v, b.v_}, {t.index_q, b.iq_}, {t.index_k, b.ik_}};
    return {{t.q, b.qg_}, {t.k, b.k_}, {t.v, b.v_}};
  }
  const bool interleaved = g.gdn_interleaved_ba;
  if (t.ssm_in) {
    if (interleaved) return {{t.ssm_in, b.qkvz_}, {t.ba, b.beta_}};
    return {{t.ssm_in, b.qkvz_}, {t.beta, b.beta_}, {t.alpha, b.alpha_}};
  }
  float* z = gdn_z(g, t, b.qkvz_, rows);
  if (interleaved) return {{t.qkv, b.qkvz_}, {t.gate, z}, {t.ba, b.beta_}};
  return {{t.qkv, b.qkvz_}, {t.gate, z}, {t.beta, b.beta_}, {t.alpha, b.alpha_}};
}

// The shared expert's input products: its gate and up.
template <class Buffers>
Products shared_inputs(const LayerTensors& t, const Buffers& b) {
  return {{t.shared_gate, b.sh_g_}, {t.shared_up, b.sh_u_}};
}

// Every product of the FFN's input x: the router's logits, then the shared expert's gate and up.
template <class Buffers>
Products ffn_inputs(const LayerTensors& t, const Buffers& b) {
  return {{t.router, b.router_logits_}, {t.shared_gate, b.sh_g_}, {t.shared_up, b.sh_u_}};
}

// The hyper-connection read as a chain of eight launches over the path's rows: the streams' grouped RMSNorm, the
// down (and inject) products, their gates, the up product, the mix into x, and inj [rows][hc] (null: the final
// mixer, which has none). It runs where the path has no fused read for the weights' forms and shapes
// (kernels/hc_read.cuh); x's q8_32 form for `readers` comes after it, where the path's products read one.
template <class Path>
void hc_read_chain(const Path& p, const float* streams, const HcTensors& t, float* x, float* inj,
                   const Products& readers, cudaStream_t s) {
  const ModelGeometry& g = p.geometry();
  const auto& b = p.buffers;
  const int rows = p.rows, hc = g.hc_count, n = g.n_embd;
  const float inv_hc = 1.0f / static_cast<float>(hc);
  STRATA_CUDA_TRY(kernels::rms_norm_grouped(streams, t.norm, b.normed_, rows, hc, n, g.rms_eps, s));
  if (inj) p.project(b.normed_, {{t.down, b.down_}, {t.inject, b.inject_}}, s);
  else p.project(b.normed_, {{t.down, b.down_}}, s);
  STRATA_CUDA_TRY(kernels::scaled_activation(b.down_, b.down_, rows * g.hc_rank, kernels::Activation::Silu, inv_hc,
                                             1.0f, s));
  p.project(b.down_, {{t.up, b.up_}}, s);
  STRATA_CUDA_TRY(kernels::hc_mix(b.up_, b.normed_, x, rows, hc, n, s));
  if (inj) {
    STRATA_CUDA_TRY(kernels::scaled_activation(b.inject_, inj, rows * hc, kernels::Activation::Sigmoid, inv_hc, 2.0f,
                                               s));
  }
  p.quantize_for(x, readers, s);
}

// A block's input x [rows][n] from the streams [rows][hc][n], for its products `readers`: with hyper-connections
// the read (the path's fused one where it has it, else the chain) with the block's injection weights inj; with
// one stream its RMSNorm by `norm`, which writes x's q8_32 form where the path asks for it.
template <class Path>
void read_streams(const Path& p, const float* streams, const HcTensors& hc, const float* norm, float* x, float* inj,
                  const Products& readers, cudaStream_t s) {
  const ModelGeometry& g = p.geometry();
  if (g.hc_count == 0) {
    STRATA_CUDA_TRY(kernels::rms_norm(streams, norm, x, p.rows, g.n_embd, g.rms_eps, s, p.q8_beside(readers)));
    return;
  }
  if (!p.hc_read_fused(streams, hc, x, inj, readers, s)) hc_read_chain(p, streams, hc, x, inj, readers, s);
}

// A block's output y [rows][n] into the streams: weighted per stream by inj [rows][hc] with hyper-connections,
// added to the one stream without; then `add` to every stream (a layer's control vectors, after its last write).
template <class Path>
void write_streams(const Path& p, const float* inj, const float* y, cudaStream_t s, kernels::StreamAddend add = {}) {
  const ModelGeometry& g = p.geometry();
  if (g.hc_count > 0) add_to_streams(p.streams(), inj, g.hc_count, y, p.rows, g.hc_count, g.n_embd, s, add);
  else add_to_streams(p.streams(), p.ones(), 0, y, p.rows, 1, g.n_embd, s, add);
}

// The shared expert on its gate and up rows: SwiGLU, down, and its gate over x.
template <class Path>
void shared_expert(const Path& p, const LayerTensors& t, cudaStream_t s) {
  const ModelGeometry& g = p.geometry();
  const auto& b = p.buffers;
  const Products down{{t.shared_down, b.shared_}};
  STRATA_CUDA_TRY(kernels::swiglu(b.sh_g_, b.sh_u_, b.sh_h_, p.rows * g.shared_ff, s, p.q8_beside(down)));
  p.project_produced(b.sh_h_, down, s);
  STRATA_CUDA_TRY(kernels::shared_expert_gate(t.shared_gate_inp, b.x_, b.shared_gate_, p.rows, g.n_embd, s));
}

// Layer `layer` up to its routed experts' hand-off.
template <class Path>
void layer_to_handoff(const Path& p, int layer, cudaStream_t s) {
  const ModelGeometry& g = p.geometry();
  const LayerTensors& t = p.tensors().layers[layer];
  const auto& b = p.buffers;
  if (layer == g.ple_layer) p.ple(layer, s);
  const Products mixer_in = mixer_inputs(g, t, layer, p.rows, b);
  read_streams(p, p.streams(), t.hc_attn, t.attn_norm, b.x_, b.inj_attn_, mixer_in, s);
  if (g.recurrent[layer]) p.mixer_gdn(layer, mixer_in, s);
  else p.mixer_attention(layer, mixer_in, s);
  write_streams(p, b.inj_attn_, b.y_, s);
  read_streams(p, p.streams(), t.hc_ffn, t.post_attention_norm, b.x_, p.ffn_injection(layer), ffn_inputs(t, b), s);
  p.route(layer, s);
  shared_expert(p, t, s);
  p.beside_routed(layer, s);
}

// Layer `layer` from its routed experts' hand-off on: their rows, combined with the shared expert's, into the
// streams, and the layer's control vectors with them: this write is the layer's last, so its output is the
// streams after it (the reference's order: streams + write, then + vector; docs/control_vectors.md).
template <class Path>
void layer_from_handoff(const Path& p, int layer, cudaStream_t s) {
  const auto& b = p.buffers;
  p.routed_rows(layer, s);
  STRATA_CUDA_TRY(kernels::moe_combine(b.routed_, b.shared_, b.shared_gate_, b.y_, p.rows, p.geometry().n_embd, s));
  p.late_rows(layer, s);
  write_streams(p, p.ffn_injection(layer), b.y_, s, p.steering(layer));
}

}  // namespace strata
