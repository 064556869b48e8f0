// What a layer's blocks are made of, over a rows dimension (one row per token: the decode token's one, a prompt
// chunk's n), written once for every path: which projections each activation feeds and how a block's output is
// added back to the residual streams.
#pragma once

#include <cuda_runtime.h>

#include "../../kernels/hc.cuh"
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

}  // namespace strata
