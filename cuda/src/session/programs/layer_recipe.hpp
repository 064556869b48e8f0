// What a layer's blocks are made of, over a rows dimension (one row per token: the decode token's one, a prompt
// chunk's n), written once for every path: which projections each activation feeds and how a block's output is
// added back to the residual streams.
#pragma once

#include <cuda_runtime.h>

#include "../../kernels/hc.cuh"
#include "../../kernels/norm.cuh"
#include "../weights/decode_tensors.hpp"
#include "mixer_shapes.hpp"
#include "projection.hpp"
#include "strata/error.hpp"
#include "strata/geometry.hpp"

namespace strata {

// y's rows into the residual streams h [rows][streams][width]: h[r][k] += inj[r * inj_stride + k] * y[r]
// (kernels::hc_write; inj_stride 0: every row's weights are the same [streams]).
inline void add_to_streams(float* h, const float* inj, int inj_stride, const float* y, int rows, int streams,
                           int width, cudaStream_t s) {
  STRATA_CUDA_TRY(kernels::hc_write(h, inj, inj_stride, y, rows, streams, width, s));
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

}  // namespace strata
