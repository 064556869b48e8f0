#include "decode_tensors.hpp"

#include <string>

#include "../../kernels/gemv.cuh"
#include "strata/error.hpp"

namespace strata {
namespace {

class Resolver {
 public:
  Resolver(const DeviceWeights& weights) : weights_(weights) {}

  const DeviceTensor* matrix(const std::string& name, long rows, long cols) const {
    const DeviceTensor& t = weights_.get(name);
    STRATA_EXPECTS(t.rows == rows && t.cols == cols, InvalidArgument,
                   "tensor " + name + " is " + std::to_string(t.rows) + " x " + std::to_string(t.cols) +
                       " (rows x cols); the geometry needs " + std::to_string(rows) + " x " + std::to_string(cols));
    STRATA_EXPECTS(t.is_float || kernels::gemv_quant_supports(t.form), InvalidArgument,
                   "tensor " + name + " has a quantized form the GPU GEMV lacks");
    return &t;
  }

  const DeviceTensor* optional_matrix(const std::string& name, long rows, long cols) const {
    return weights_.has(name) ? matrix(name, rows, cols) : nullptr;
  }

  const float* vector(const std::string& name, long count) const {
    const DeviceTensor& t = weights_.get(name);
    STRATA_EXPECTS(t.is_float && t.float_kind == FloatKind::F32, InvalidArgument,
                   "tensor " + name + " is read elementwise and must be F32 in VRAM (the loader converts it)");
    STRATA_EXPECTS(t.rows * t.cols == count, InvalidArgument,
                   "tensor " + name + " has " + std::to_string(t.rows * t.cols) + " elements; the geometry needs " +
                       std::to_string(count));
    return static_cast<const float*>(t.data);
  }

  HcTensors hc(const std::string& prefix, const ModelGeometry& g, bool inject) const {
    const long width = static_cast<long>(g.hc_count) * g.n_embd;
    HcTensors t;
    t.norm = vector(prefix + "_norm.weight", width);
    t.down = matrix(prefix + "_down.weight", g.hc_rank, width);
    t.up = matrix(prefix + "_up.weight", width, g.hc_rank);
    if (inject) t.inject = matrix(prefix + "_inject.weight", g.hc_count, width);
    return t;
  }

 private:
  const DeviceWeights& weights_;
};

void resolve_gdn(const Resolver& r, const std::string& p, const ModelGeometry& g, LayerTensors& t) {
  const long n = g.n_embd, hv = g.ssm_n_v_heads;
  const long key_dim = static_cast<long>(g.ssm_n_k_heads) * g.ssm_head_k_dim, value_dim = hv * g.ssm_head_v_dim;
  const long conv = 2 * key_dim + value_dim;
  t.ssm_in = r.optional_matrix(p + "ssm_in.weight", conv + value_dim, n);
  if (!t.ssm_in) {
    t.qkv = r.matrix(p + "attn_qkv.weight", conv, n);
    t.gate = r.matrix(p + "attn_gate.weight", value_dim, n);
  }
  if (g.gdn_interleaved_ba) {
    t.ba = r.matrix(p + "ssm_ba.weight", 2 * hv, n);
  } else {
    t.beta = r.matrix(p + "ssm_beta.weight", hv, n);
    t.alpha = r.matrix(p + "ssm_alpha.weight", hv, n);
  }
  t.conv1d = r.vector(p + "ssm_conv1d.weight", conv * g.ssm_conv_kernel);
  t.ssm_a = r.vector(p + "ssm_a", hv);
  t.dt_bias = r.vector(p + "ssm_dt.bias", hv);
  t.ssm_norm = r.vector(p + "ssm_norm.weight", g.ssm_head_v_dim);
  t.ssm_out = r.matrix(p + "ssm_out.weight", n, value_dim);
}

void resolve_attention(const Resolver& r, const std::string& p, const ModelGeometry& g, LayerTensors& t) {
  const long n = g.n_embd, hd = g.head_dim;
  t.q = r.matrix(p + "attn_q.weight", 2 * g.n_head * hd, n);
  t.k = r.matrix(p + "attn_k.weight", g.n_head_kv * hd, n);
  t.v = r.matrix(p + "attn_v.weight", g.n_head_kv * hd, n);
  t.o = r.matrix(p + "attn_output.weight", n, g.n_head * hd);
  t.q_norm = r.vector(p + "attn_q_norm.weight", hd);
  t.k_norm = r.vector(p + "attn_k_norm.weight", hd);
  if (g.indexer_head_dim > 0) {
    t.index_q =
        r.optional_matrix(p + "indexer.q_proj.weight", static_cast<long>(g.indexer_n_heads) * g.indexer_head_dim, n);
    if (t.index_q) {
      t.index_k = r.matrix(p + "indexer.k_proj.weight", g.indexer_head_dim, n);
      t.index_q_norm = r.vector(p + "indexer.q_norm.weight", g.indexer_head_dim);
      t.index_k_norm = r.vector(p + "indexer.k_norm.weight", g.indexer_head_dim);
    }
  }
}

void resolve_moe(const Resolver& r, const std::string& p, const ModelGeometry& g, LayerTensors& t) {
  const long n = g.n_embd;
  t.router = r.matrix(p + "ffn_gate_inp.weight", g.n_expert, n);
  t.shared_gate = r.matrix(p + "ffn_gate_shexp.weight", g.shared_ff, n);
  t.shared_up = r.matrix(p + "ffn_up_shexp.weight", g.shared_ff, n);
  t.shared_down = r.matrix(p + "ffn_down_shexp.weight", n, g.shared_ff);
  t.shared_gate_inp = r.vector(p + "ffn_gate_inp_shexp.weight", n);
}

void resolve_ple(const Resolver& r, const std::string& p, const ModelGeometry& g, LayerTensors& t) {
  const long width = static_cast<long>(g.hc_count) * g.n_embd;
  const long rows = static_cast<long>(g.ple_n_heads) * g.ple_head_dim;
  t.ple_key = r.matrix(p + "ple_key.weight", width, rows);
  t.ple_value = r.matrix(p + "ple_value.weight", g.n_embd, rows);
  t.ple_norm_key = r.vector(p + "ple_norm_key.weight", width);
  t.ple_norm_query = r.vector(p + "ple_norm_query.weight", width);
  t.ple_norm_conv = r.vector(p + "ple_norm_conv.weight", width);
  t.ple_conv = r.vector(p + "ple_conv1d.weight", width * g.ple_conv_kernel);
}

}  // namespace

ModelTensors resolve_tensors(const DeviceWeights& weights, const ModelGeometry& g) {
  const Resolver r(weights);
  const bool hc = g.hc_count > 0;
  ModelTensors m;
  m.embedding = r.matrix("token_embd.weight", g.n_vocab, g.n_embd);
  m.head = r.optional_matrix("output.weight", g.n_vocab, g.n_embd);
  if (!m.head) m.head = m.embedding;
  if (hc) {
    m.output_hc = r.hc("output_hc", g, false);
  } else {
    m.output_norm = r.vector("output_norm.weight", g.n_embd);
  }
  m.layers.resize(g.n_layer);
  for (int l = 0; l < g.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerTensors& t = m.layers[l];
    if (hc) {
      t.hc_attn = r.hc(p + "hc_attn", g, true);
      t.hc_ffn = r.hc(p + "hc_ffn", g, true);
    } else {
      t.attn_norm = r.vector(p + "attn_norm.weight", g.n_embd);
      t.post_attention_norm = r.vector(p + "post_attention_norm.weight", g.n_embd);
    }
    if (g.recurrent[l]) {
      resolve_gdn(r, p, g, t);
    } else {
      resolve_attention(r, p, g, t);
    }
    resolve_moe(r, p, g, t);
    if (l == g.ple_layer) resolve_ple(r, p, g, t);
  }
  return m;
}

}  // namespace strata
