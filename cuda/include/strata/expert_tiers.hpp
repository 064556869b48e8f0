// The tiers of the routed experts below VRAM (docs/tiers.md): a layer's experts either all in host RAM (the
// pool's registered planes, ExpertPool::set_layer) or tiered: `slots` of them in a page-locked arena of the pool,
// the rest read from the model file while the pool works (ExpertPool::set_tiered_layer). What the pool needs to
// find an expert in the file and repack it is here: the block layouts of the file's expert tensors, and where
// each matrix lies. Host-only, no CUDA.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::cpu {

// The block layouts of the file's expert tensors the pool repacks itself into their canonical forms
// (docs/forms.md), numbered as ggml numbers its types. The native core still reads no GGUF container: Python
// finds each tensor and says where it lies (FileMatrix); only the bytes of a block are known here. The lattice
// i-quants (IQ1_*, IQ2_*, IQ3_*) are not yet among them: a layer of those types stays whole in RAM.
enum class BlockType : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
  Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Whether the pool repacks blocks of ggml type id `type`.
bool block_type_supported(int type);

// One matrix of every expert of a layer in the file: expert e's rows x cols weights are the bytes
// [offset + e * expert_stride, + rows * cols / elements-per-block * bytes-per-block).
struct FileMatrix {
  std::int64_t offset = 0;
  std::int64_t expert_stride = 0;
  BlockType type = BlockType::F32;
};

// How a tiered layer's arena follows the routing (the VRAM cache's replacement idea one tier down,
// strata/expert_policy.hpp): a missed expert that misses `admit_after` times within `window` calls of its layer
// is read into the slot used least recently, at most `max_moves` experts per call. Decode calls
// (run_layer, run_layer_sum) move experts; a prompt chunk's grouped call reads its misses without moving any.
struct TierPolicy {
  bool replace = true;  // false: the arena keeps the experts it started with
  int admit_after = 3;
  int window = 16;
  int max_moves = 2;
};

// What a tiered layer did since it was set (ExpertPool::tier_stats).
struct TierLayerStats {
  int layer = 0;
  int slots = 0;                  // experts its arena holds
  std::int64_t hits = 0;          // routed experts found in the arena
  std::int64_t misses = 0;        // routed experts read from the file (once per call each)
  std::int64_t moves = 0;         // misses admitted into the arena
  std::int64_t bytes_read = 0;    // file bytes read for its misses and its fill (with O_DIRECT's alignment)
  std::vector<int> experts;       // the arena's experts now, slot by slot (-1: empty)
};

}  // namespace strata::cpu
