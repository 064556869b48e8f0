// The model as the native core sees it: sizes and the flags of the architecture's variant, no architecture
// name (strata.runtime.geometry builds it from strata.models.Geometry). Host-only header.
#pragma once

#include <vector>

namespace strata {

struct ModelGeometry {
  int n_layer = 0, n_embd = 0, n_vocab = 0;
  std::vector<bool> recurrent;  // per layer: Gated DeltaNet (true) or attention
  int n_head = 0, n_head_kv = 0, head_dim = 0, rope_dim = 0;
  double rope_theta = 0.0;
  float rms_eps = 1e-6f;
  int ssm_n_k_heads = 0, ssm_n_v_heads = 0, ssm_head_k_dim = 0, ssm_head_v_dim = 0, ssm_conv_kernel = 0;
  bool gdn_tiled_heads = false;     // value head h reads key head h % ssm_n_k_heads (else h / (v_heads / k_heads))
  bool gdn_interleaved_ba = false;  // b and a come from one ssm_ba projection, interleaved per key head
  bool gdn_sigmoid_gate = false;    // output gate sigmoid(z) (else silu(z))
  int n_expert = 0, n_expert_used = 0, expert_ff = 0, shared_ff = 0;
  int hc_count = 0, hc_rank = 0;  // 0: one residual stream with pre-norms
  int indexer_n_heads = 0, indexer_head_dim = 0, indexer_top_k = 0;  // 0: no QSA indexer
  std::vector<int> compress_ratios;  // per layer: QSA block tokens (used on indexed attention layers)
  int ple_layer = -1, ple_ngram = 0, ple_conv_kernel = 0, ple_n_heads = 0, ple_head_dim = 0;

  int attention_layers() const;
  int conv_channels() const { return 2 * ssm_n_k_heads * ssm_head_k_dim + ssm_n_v_heads * ssm_head_v_dim; }
  int streams() const { return hc_count > 0 ? hc_count : 1; }
  // Normalised gated rows the PLE conv keeps from earlier tokens: dilation (the n-gram order) * (kernel - 1).
  int ple_history() const { return ple_layer >= 0 ? ple_ngram * (ple_conv_kernel - 1) : 0; }
};

// Throws InvalidArgument naming the first field that no model could have (a size <= 0, a per-layer list of the
// wrong length, a PLE layer without hyper-connections).
void check_geometry(const ModelGeometry& g);

}  // namespace strata
