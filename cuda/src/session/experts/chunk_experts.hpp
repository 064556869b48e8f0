// A prompt chunk's routed experts (docs/prompt.md): each MoE layer's routing comes back to the host, which groups
// it by expert (chunk_routes.hpp) and computes every expert once for all the rows that chose it: in place where
// the VRAM cache holds it, else from the staging (the whole next layer copied ahead when the chunk touches most of
// it), and for a small chunk a share of them on the CPU pool beside the staging. The prompt program hands each
// MoE layer's rows over at the layer recipe's hand-off (programs/layer_recipe.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "../../runtime/pinned_memory.hpp"
#include "../products/projection.hpp"
#include "../weights/decode_tensors.hpp"
#include "chunk_routes.hpp"
#include "strata/expert_cache.hpp"
#include "strata/expert_pool.hpp"
#include "strata/expert_staging.hpp"
#include "strata/geometry.hpp"

namespace strata {

// The chunk's device rows the experts read and write, in the prompt program's scratch ([rows][...] each).
struct ChunkExpertRows {
  const float* x = nullptr;                        // [rows][n_embd] the FFN's input
  const int* route_ids = nullptr;                  // [rows][k] the router's choice and weights
  const float* route_weights = nullptr;
  int *row_token = nullptr, *row_of = nullptr;     // the routes, copied up (ChunkRoutes)
  int *group_slot = nullptr, *group_begin = nullptr;
  float* ex_x = nullptr;                           // [pairs][n_embd] each routed row's x, grouped by expert
  Q8Scratch ex_x8;
  float *ex_gate = nullptr, *ex_up = nullptr, *ex_hidden = nullptr;  // [pairs][expert_ff]
  Q8Scratch ex_h8;
  float* ex_rows = nullptr;                        // [pairs][n_embd] each routed row's expert output, unweighted
  float* routed = nullptr;                         // [rows][n_embd] out: each row's experts, weighted and summed
};

// Routed (layer, expert) computations since the counters began, by where the weights were.
struct ChunkExpertStats {
  long staged_experts = 0, cached_experts = 0, pooled_experts = 0;
  std::size_t staged_bytes = 0;  // bytes the staging copied over PCIe
};

class ChunkExperts {
 public:
  // Chunks of up to `chunk` rows of `g`; `staging` (required for a layer whose experts the cache lacks) and
  // `cache` (may be null) outlive it. With `pool` and a `cpu_share` in (0, 1), a chunk too small to prefetch whole
  // layers has the pool compute that share of the bytes of the experts it touches that the cache lacks.
  ChunkExperts(const ModelGeometry& g, const ModelTensors& t, int chunk, ExpertStaging* staging,
               const ExpertCache* cache, cpu::ExpertPool* pool, double cpu_share);

  // A chunk of `rows` rows begins: what a chunk that failed midway prefetched is forgotten; returns whether this
  // one copies whole layers ahead of their routing (prefetch_after).
  bool begin_chunk(int rows);
  // The first layer after `layer` (-1: from the first) whose experts the cache lacks, copied whole into the next
  // staging buffer ahead of its routing.
  void prefetch_after(int layer);

  // Layer `layer`'s routed experts for the chunk's `rows` rows, enqueued on `s` (the host waits for the routing):
  // rows.routed holds each row's weighted sum after them.
  void run(int layer, int rows, const ChunkExpertRows& b, cudaStream_t s);

  const ChunkExpertStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

 private:
  void expert_rows(const CachedLayer& stacks, const ChunkRoutes::Part& part, const ChunkExpertRows& b,
                   cudaStream_t s) const;
  void pool_experts(int layer, const ChunkExpertRows& b, cudaStream_t s);
  void choose_cpu_experts(const int* ids, int pairs);
  void count_staged(int layer, std::size_t experts);
  void prefetch(int layer);

  const ModelGeometry& g_;
  const ModelTensors& t_;
  int chunk_;
  ExpertStaging* staging_;
  const ExpertCache* cache_;
  PinnedMapped host_;            // the routing ids down, the routes up
  cpu::ExpertPool* pool_;
  double cpu_share_;
  int cpu_rows_max_ = 0;         // the CPU's rows per layer at most: a chunk it serves routes fewer
  PinnedMapped cpu_io_;          // the chunk's x rows down, the pool's input and output rows
  std::vector<char> on_cpu_;
  ChunkRoutes routes_;
  std::vector<int> cache_map_;
  // The staging buffer that holds, or is copying, each layer's prefetched experts (-1: none); the next fill.
  std::vector<int> prefetched_buffer_;
  std::vector<std::vector<int>> prefetched_;
  int next_buffer_ = 0;
  ChunkExpertStats stats_;
};

}  // namespace strata
