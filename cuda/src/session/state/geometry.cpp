#include "strata/geometry.hpp"

#include <string>

#include "strata/error.hpp"

namespace strata {
namespace {

void positive(int value, const char* field) {
  STRATA_EXPECTS(value > 0, InvalidArgument,
                 std::string("model geometry: ") + field + " must be > 0, got " + std::to_string(value));
}

}  // namespace

int ModelGeometry::attention_layers() const {
  int count = 0;
  for (bool r : recurrent) count += r ? 0 : 1;
  return count;
}

void check_geometry(const ModelGeometry& g) {
  positive(g.n_layer, "n_layer");
  positive(g.n_embd, "n_embd");
  positive(g.n_vocab, "n_vocab");
  positive(g.n_expert, "n_expert");
  positive(g.n_expert_used, "n_expert_used");
  positive(g.shared_ff, "shared_ff");
  STRATA_EXPECTS(static_cast<int>(g.recurrent.size()) == g.n_layer, InvalidArgument,
                 "model geometry: recurrent has " + std::to_string(g.recurrent.size()) + " entries for " +
                     std::to_string(g.n_layer) + " layers");
  if (g.attention_layers() > 0) {
    positive(g.n_head_kv, "n_head_kv");
    positive(g.head_dim, "head_dim");
  }
  if (g.attention_layers() < g.n_layer) {
    positive(g.ssm_n_k_heads, "ssm_n_k_heads");
    positive(g.ssm_n_v_heads, "ssm_n_v_heads");
    positive(g.ssm_conv_kernel, "ssm_conv_kernel");
  }
  STRATA_EXPECTS(g.hc_count == 0 || g.hc_rank > 0, InvalidArgument, "model geometry: hc_rank must be > 0");
  STRATA_EXPECTS(g.ple_layer < 0 || (g.ple_layer < g.n_layer && g.hc_count > 0 && g.ple_n_heads > 0 &&
                                     g.ple_head_dim > 0 && g.ple_ngram > 0 && g.ple_conv_kernel > 1),
                 InvalidArgument, "model geometry: the PLE layer " + std::to_string(g.ple_layer) +
                                      " needs hyper-connections and positive PLE sizes");
  STRATA_EXPECTS(g.indexer_head_dim == 0 || static_cast<int>(g.compress_ratios.size()) == g.n_layer,
                 InvalidArgument, "model geometry: compress_ratios needs one entry per layer");
  for (int l = 0; l < static_cast<int>(g.compress_ratios.size()); ++l) {
    STRATA_EXPECTS(g.recurrent[l] || g.compress_ratios[l] > 0, InvalidArgument,
                   "model geometry: compress_ratios[" + std::to_string(l) + "] must be > 0 on an attention layer");
  }
}

}  // namespace strata
