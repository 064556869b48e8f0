// Views of one sequence's state in its session arena, per layer: paged KV and the QSA indexer's caches
// (attention layers), the recurrent and conv state (GDN layers), the PLE history and the residual streams. The
// decode program and the prompt program read and write the same state through these.
#pragma once

#include <vector>

#include "../../kernels/attention.cuh"
#include "../../kernels/gdn.cuh"
#include "../../kernels/kv.cuh"
#include "../../kernels/kv_window.cuh"
#include "../../kernels/ple.cuh"
#include "../../kernels/qsa.cuh"
#include "../weights/decode_tensors.hpp"
#include "strata/geometry.hpp"
#include "strata/session_arena.hpp"

namespace strata {

// A verification step's row states (docs/speculative.md): for row t of a chunk, the recurrent state as token t
// leaves it, in the arena's snapshot slots after the sequence's own; a row's every region `stride` floats after
// the row before's. count 0: the sequence keeps none (no verification steps).
struct RowStates {
  int count = 0;
  long stride = 0;
  std::vector<float*> gdn_state, gdn_conv;  // per layer (GDN layers): row 0's
  float* ple_history = nullptr;
};

struct SequenceViews {
  int context = 0;                                   // tokens of KV: whole pages
  KvStorage kv_storage = KvStorage::Int8;
  bool kv_streaming = false;                         // every attention layer's KV on the host, a window in VRAM
  std::vector<kernels::PagedKv> kv;                  // per layer (attention layers): what decode reads and writes,
                                                     // the window's view under streaming
  std::vector<kernels::KvWindow> window;             // per layer (attention layers) under streaming
  std::vector<kernels::IndexerShape> index_shape;    // per layer (indexed layers)
  std::vector<kernels::IndexerCache> index_cache;
  std::vector<float*> gdn_state, gdn_conv;           // per layer (GDN layers)
  float* ple_history = nullptr;
  float* streams = nullptr;                           // the residual streams [hc][n] of the last token run
  RowStates rows;
};

// GDN layer `layer`'s weights and state as the mixer kernels take them; the per-token pointers stay null.
kernels::GdnStepArgs gdn_layer_args(const LayerTensors& t, const SequenceViews& v, int layer);

// The PLE layer's weights and history as ple_step and ple_chunk take them; the per-token pointers stay null.
kernels::PleStepArgs ple_layer_args(const LayerTensors& t, const SequenceViews& v);

// Attention layer `t`'s prep of the rows q_gate, k, v into q_out, with the RoPE tables; the position stays null
// (decode's comes from its stage, a step's rows' from their own).
kernels::AttentionPrepArgs attention_prep_args(const LayerTensors& t, const float* rope_cos, const float* rope_sin,
                                               const float* q_gate, const float* k, const float* v, float* q_out);

// Attention layer `t`'s QSA selection from the indexer's q rows into scores, selected and n_selected, with the RoPE
// tables; the position stays null.
kernels::IndexerSelectArgs indexer_select_args(const LayerTensors& t, const float* rope_cos, const float* rope_sin,
                                               const float* q, float* scores, int* selected, int* n_selected);

// The views of `arena`'s regions; its last `row_states` snapshot slots are the rows' (RowStates).
SequenceViews sequence_views(const ModelGeometry& g, const ModelTensors& t, const SessionArena& arena,
                             KvStorage kv_storage, int row_states);

// The views of any arena of `layout` as offsets into it, and the row states' as offsets into a row's snapshot slot
// (rows.count 0): what a step over spans takes, each span naming its sequence's arena and first row slot
// (kernels/state_spans.cuh). Every sequence of one geometry, context and KV format has the same offsets up to its
// snapshots. InvalidArgument for a layout that streams its KV (two arenas).
SequenceViews arena_offsets(const ModelGeometry& g, const ModelTensors& t, const SessionLayout& layout,
                            KvStorage kv_storage);

}  // namespace strata
