// The mixers' kernel shapes from the model geometry: one definition for the decode and the prompt programs.
#pragma once

#include <algorithm>

#include "../../kernels/attention.cuh"
#include "../../kernels/gdn.cuh"
#include "../../kernels/ple.cuh"
#include "../../kernels/qsa.cuh"
#include "strata/geometry.hpp"

namespace strata {

// The widths of one token's rows that the programs size their buffers by (decode: one row each; the prompt
// path: one row per token of a chunk).
struct RowWidths {
  int n = 0, hc = 0, width = 0;            // n_embd; the streams (1 without hyper-connections) and all of them
  int value_dim = 0, conv = 0;             // GDN: the values, and the conv's channels (q, k and v)
  int heads_dim = 0, kv_dim = 0;           // attention: every query head, every KV head
  int ple_width = 0;                       // the PLE rows of one token
  int max_cols = 0;                        // the widest input a dense weight reads (its q8_32 form's size)
};

inline RowWidths row_widths(const ModelGeometry& g) {
  RowWidths w;
  w.n = g.n_embd;
  w.hc = std::max(g.hc_count, 1);
  w.width = w.hc * w.n;
  w.value_dim = g.ssm_n_v_heads * g.ssm_head_v_dim;
  w.conv = 2 * g.ssm_n_k_heads * g.ssm_head_k_dim + w.value_dim;
  w.heads_dim = g.n_head * g.head_dim;
  w.kv_dim = g.n_head_kv * g.head_dim;
  w.ple_width = g.ple_n_heads * g.ple_head_dim;
  w.max_cols = std::max({w.width, w.n, w.value_dim, w.heads_dim, g.shared_ff, w.ple_width, g.hc_rank, 32});
  return w;
}

inline kernels::GdnShape gdn_shape(const ModelGeometry& g) {
  kernels::GdnShape shape;
  shape.n_k_heads = g.ssm_n_k_heads;
  shape.n_v_heads = g.ssm_n_v_heads;
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
  return {g.indexer_n_heads, g.indexer_head_dim, ratio, g.indexer_top_k / ratio, g.rope_dim, context / ratio,
          g.rms_eps};
}

}  // namespace strata
