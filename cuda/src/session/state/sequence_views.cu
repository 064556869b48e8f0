#include "sequence_views.hpp"

#include "../products/mixer_shapes.hpp"

#include <cstddef>
#include <string>

#include "strata/error.hpp"

namespace strata {

kernels::GdnStepArgs gdn_layer_args(const LayerTensors& t, const SequenceViews& v, int layer) {
  kernels::GdnStepArgs args;
  args.conv_weight = t.conv1d;
  args.ssm_a = t.ssm_a;
  args.dt_bias = t.dt_bias;
  args.norm_weight = t.ssm_norm;
  args.conv_state = v.gdn_conv[layer];
  args.state = v.gdn_state[layer];
  return args;
}

kernels::PleStepArgs ple_layer_args(const LayerTensors& t, const SequenceViews& v) {
  kernels::PleStepArgs args;
  args.norm_key = t.ple_norm_key;
  args.norm_query = t.ple_norm_query;
  args.norm_conv = t.ple_norm_conv;
  args.conv_weight = t.ple_conv;
  args.history = v.ple_history;
  return args;
}

kernels::AttentionPrepArgs attention_prep_args(const LayerTensors& t, const float* rope_cos, const float* rope_sin,
                                               const float* q_gate, const float* k, const float* v, float* q_out) {
  kernels::AttentionPrepArgs prep;
  prep.q_gate = q_gate;
  prep.k = k;
  prep.v = v;
  prep.q_norm = t.q_norm;
  prep.k_norm = t.k_norm;
  prep.rope_cos = rope_cos;
  prep.rope_sin = rope_sin;
  prep.q_out = q_out;
  return prep;
}

kernels::IndexerSelectArgs indexer_select_args(const LayerTensors& t, const float* rope_cos, const float* rope_sin,
                                               const float* q, float* scores, int* selected, int* n_selected) {
  kernels::IndexerSelectArgs select;
  select.q = q;
  select.q_norm = t.index_q_norm;
  select.rope_cos = rope_cos;
  select.rope_sin = rope_sin;
  select.scores = scores;
  select.selected_blocks = selected;
  select.n_selected = n_selected;
  return select;
}

namespace {

// `count` row states from the slot at `slot` (the first row's), `layout`'s slot regions after it.
RowStates row_states_at(const ModelGeometry& g, const SessionLayout& layout, char* slot, int count) {
  RowStates rows;
  rows.count = count;
  rows.stride = static_cast<long>(layout.state_bytes / sizeof(float));
  rows.gdn_state.assign(g.n_layer, nullptr);
  rows.gdn_conv.assign(g.n_layer, nullptr);
  for (int l = 0; l < g.n_layer; ++l) {
    if (!g.recurrent[l]) continue;
    rows.gdn_state[l] = reinterpret_cast<float*>(slot + layout.slot_offset("gdn state", l));
    rows.gdn_conv[l] = reinterpret_cast<float*>(slot + layout.slot_offset("gdn conv history", l));
  }
  if (g.ple_layer >= 0) rows.ple_history = reinterpret_cast<float*>(slot + layout.slot_offset("ple history"));
  return rows;
}

// The views of `layout`'s regions, each at the address region(name, layer) gives.
template <class Region>
SequenceViews views_of(const ModelGeometry& g, const ModelTensors& t, const SessionLayout& layout,
                       KvStorage kv_storage, Region region) {
  SequenceViews v;
  const int pages = layout.kv_pages;
  v.context = pages * kKvPageTokens;
  v.kv_storage = kv_storage;
  v.kv_streaming = layout.kv_streaming;
  v.kv.resize(g.n_layer);
  if (v.kv_streaming) v.window.resize(g.n_layer);
  v.index_shape.resize(g.n_layer);
  v.index_cache.resize(g.n_layer);
  v.gdn_state.assign(g.n_layer, nullptr);
  v.gdn_conv.assign(g.n_layer, nullptr);
  const int kv_dim = g.n_head_kv * g.head_dim;
  const std::size_t kv_elements = static_cast<std::size_t>(pages) * kKvPageTokens * kv_dim;
  for (int l = 0; l < g.n_layer; ++l) {
    if (g.recurrent[l]) {
      v.gdn_state[l] = static_cast<float*>(region("gdn state", l));
      v.gdn_conv[l] = static_cast<float*>(region("gdn conv history", l));
      continue;
    }
    kernels::PagedKv& kv = v.kv[l];
    kv.keys = kernels::kv_half(kv_key_codes(kv_storage), region("kv keys", l), kv_elements);
    kv.values = kernels::kv_half(kv_value_codes(kv_storage), region("kv values", l), kv_elements);
    kv.n_head_kv = g.n_head_kv;
    kv.head_dim = g.head_dim;
    kv.page_size = kKvPageTokens;
    kv.max_pages = pages;
    kv.page_table = static_cast<const int*>(region("kv page table", l));
    if (t.layers[l].index_q) {
      v.index_shape[l] = indexer_shape(g, l, v.context);
      v.index_cache[l] = {static_cast<float*>(region("indexer raw keys", l)),
                          static_cast<float*>(region("indexer block keys", l))};
    }
    if (v.kv_streaming) {  // kv[l] so far is the host copy (its regions are on the host); decode reads the window
      STRATA_EXPECTS(t.layers[l].index_q, InvalidArgument,
                     "KV streaming: attention layer " + std::to_string(l) + " has no QSA indexer tensors");
      const kernels::IndexerShape& shape = v.index_shape[l];
      v.window[l] = kernels::kv_window(region("kv window", l), kv, shape.ratio,
                                       kv_window_slots(shape.keep_blocks), shape.keep_blocks);
      kv = v.window[l].window();
    }
  }
  if (g.ple_layer >= 0) v.ple_history = static_cast<float*>(region("ple history", -1));
  v.streams = static_cast<float*>(region("residual streams", -1));
  return v;
}

}  // namespace

SequenceViews sequence_views(const ModelGeometry& g, const ModelTensors& t, const SessionArena& arena,
                             KvStorage kv_storage, int row_states_count) {
  SequenceViews v = views_of(g, t, arena.layout(), kv_storage,
                             [&](const std::string& name, int layer) { return arena.region(name, layer); });
  const int first = arena.layout().snapshots - row_states_count;
  if (row_states_count > 0) v.rows = row_states_at(g, arena.layout(), arena.slot_start(first), row_states_count);
  return v;
}

SequenceViews arena_offsets(const ModelGeometry& g, const ModelTensors& t, const SessionLayout& layout,
                            KvStorage kv_storage) {
  STRATA_EXPECTS(!layout.kv_streaming, InvalidArgument,
                 "a sequence streaming its KV keeps it in two arenas: its state has no offsets into one");
  SequenceViews v = views_of(g, t, layout, kv_storage, [&](const std::string& name, int layer) -> void* {
    for (const Region& r : layout.regions)
      if (r.name == name && r.layer == layer) return reinterpret_cast<void*>(r.offset);
    throw InvalidArgument("the session layout has no region '" + name + "' for layer " + std::to_string(layer));
  });
  v.rows = row_states_at(g, layout, nullptr, 0);
  return v;
}

}  // namespace strata
