// Host round trip of the chunk attention kernels (attention_prep_chunk, qsa_append_chunk, qsa_select_chunk,
// attention_chunk) against their oracle: the decode kernels run once per token, in order, on the same inputs
// and the same cache. Not for the token path: it allocates and synchronises. Host-only header (no CUDA types).
#pragma once

#include <cstddef>

#include "strata/check/kernel_check_mixers.hpp"
#include "strata/kv_format.hpp"

namespace strata::kernel_check {

// What one path leaves: out, q [chunk][H*d] (attention_decode's out and attention_prep's q_out per token);
// the cache halves as stored, byte for byte (k_bytes, v_bytes: chunk_cache_bytes each), and dequantized
// (k_cache, v_cache [Hkv][start + chunk][d]); with QSA the indexer caches as stored (raw_keys
// [max_blocks * ratio][di], block_keys [max_blocks][di], max_blocks = (start + chunk) / ratio + 1; cells never
// written hold the poison, NaN) and the selections (selected [chunk][keep_blocks], -1 past n_selected [chunk]).
struct ChunkCheckOutputs {
  float* out = nullptr;
  float* q = nullptr;
  unsigned char* k_bytes = nullptr;
  unsigned char* v_bytes = nullptr;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  float* raw_keys = nullptr;
  float* block_keys = nullptr;
  int* selected = nullptr;
  int* n_selected = nullptr;
};

// Floats of scratch attention_chunk takes for `chunk` queries of `shape`: 0 when it runs each query in one span.
std::size_t attention_chunk_scratch(const AttentionCheckShape& shape, int chunk);

// Spans attention_chunk cuts each of `chunk` queries' tokens into, scanned or gathered (1: none, no merge).
int attention_chunk_spans(const AttentionCheckShape& shape, int chunk, bool gathered);

// Bytes of one half (keys or values) of the check's cache of n_pages pages.
std::size_t chunk_cache_bytes(const AttentionCheckShape& shape, int n_pages, bool values);

// Tokens 0..start-1 decode one by one into a poisoned cache (logical page i in physical page page_order[i]).
// From that state, tokens start..start+chunk-1 then run (a) through the decode kernels one token at a time
// (attention_prep, qsa_append, qsa_select, attention_decode) into `stepwise`, and (b) from a copy of the
// same state through the chunk kernels at once into `at_once`, their inputs read from fused rows (one row per token
// holding q_gate, k, v, the indexer q and k) so the row strides are exercised; attention_chunk runs gathered
// or scanned (AttentionChunkArgs::gathered). Inputs are stacked over all start + chunk tokens as attention_steps
// takes them; nullptr qsa.q disables QSA.
void attention_chunk_vs_decode(int device, const AttentionCheckShape& shape, int start, int chunk, bool gathered,
                               const float* q_gate, const float* k, const float* v, const float* q_norm,
                               const float* k_norm, const float* rope_cos, const float* rope_sin,
                               const int* page_order, int n_pages, const QsaCheckInputs& qsa,
                               const ChunkCheckOutputs& stepwise, const ChunkCheckOutputs& at_once);

}  // namespace strata::kernel_check
