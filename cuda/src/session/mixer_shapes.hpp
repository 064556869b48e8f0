// The mixers' kernel shapes from the model geometry: one definition for the decode and the prompt programs.
#pragma once

#include "../kernels/attention.cuh"
#include "../kernels/gdn.cuh"
#include "../kernels/ple.cuh"
#include "../kernels/qsa.cuh"
#include "strata/geometry.hpp"

namespace strata {

inline kernels::GdnShape gdn_shape(const ModelGeometry& g) {
  kernels::GdnShape shape;
  shape.n_k_heads = g.ssm_k_heads;
  shape.n_v_heads = g.ssm_v_heads;
  shape.head_k_dim = g.ssm_head_k_dim;
  shape.head_v_dim = g.ssm_head_v_dim;
  shape.conv_kernel = g.ssm_conv_kernel;
  shape.tiled_heads = g.gdn_tiled_heads;
  shape.interleaved_ba = g.gdn_interleaved_ba;
  shape.sigmoid_gate = g.gdn_sigmoid_gate;
  shape.eps = g.rms_eps;
  return shape;
}

inline kernels::AttentionShape attention_shape(const ModelGeometry& g) {
  return {g.n_head, g.n_head_kv, g.head_dim, g.rope_dim, g.rms_eps};
}

inline kernels::PleShape ple_shape(const ModelGeometry& g) {
  return {g.hc_count, g.n_embd, g.ple_ngram, g.ple_conv_kernel, g.rms_eps};
}

// The QSA indexer of layer `layer` (an indexed attention layer) in a sequence of `context` tokens.
inline kernels::IndexerShape indexer_shape(const ModelGeometry& g, int layer, int context) {
  const int ratio = g.compress_ratios.at(layer);
  return {g.indexer_heads, g.indexer_head_dim, ratio, g.indexer_budget / ratio, g.rope_dim, context / ratio,
          g.rms_eps};
}

}  // namespace strata
