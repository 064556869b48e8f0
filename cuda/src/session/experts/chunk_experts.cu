#include "chunk_experts.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "../../kernels/moe.cuh"
#include "../../kernels/quantize.cuh"
#include "strata/decode_session.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// A chunk touches most of a layer's experts once its routed rows reach prompt_prefetch_rows (decode_session.hpp):
// then copying the whole next layer ahead, beside this one's work, beats waiting for its routing to copy only
// what it touches.
bool prefetches_layers(const ModelGeometry& g, int rows) {
  return rows * g.n_expert_used >= prompt_prefetch_rows(g);
}

// The pinned block of a chunk's routing: the routed ids (down), then the route arrays (up): row tokens, row_of,
// group slots and group begins.
std::size_t routes_offset(const ModelGeometry& g, int chunk) {
  return sizeof(int) * static_cast<std::size_t>(chunk) * g.n_expert_used;
}
std::size_t host_bytes(const ModelGeometry& g, int chunk) {
  const std::size_t pairs = static_cast<std::size_t>(chunk) * g.n_expert_used;
  return routes_offset(g, chunk) + sizeof(int) * (5 * pairs + 1);
}

}  // namespace

ChunkExperts::ChunkExperts(const ModelGeometry& g, const ModelTensors& t, int chunk, ExpertStaging* staging,
                           const ExpertCache* cache, cpu::ExpertPool* pool, double cpu_share)
    : g_(g),
      t_(t),
      chunk_(chunk),
      staging_(staging),
      cache_(cache),
      host_(host_bytes(g, chunk)),
      pool_(cpu_share > 0.0 && cpu_share < 1.0 ? pool : nullptr),
      cpu_share_(cpu_share),
      // The chunks the CPU serves are those below prefetches_layers: fewer than prompt_prefetch_rows routed rows.
      cpu_rows_max_(pool_ ? std::min(prompt_prefetch_rows(g), chunk * g.n_expert_used) : 0),
      cpu_io_(sizeof(float) * std::max<std::size_t>(1, static_cast<std::size_t>(g.n_embd) *
                                                      (std::min(chunk, cpu_rows_max_) + 2 * cpu_rows_max_))),
      prefetched_buffer_(g.n_layer, -1),
      prefetched_(g.n_layer) {}

bool ChunkExperts::begin_chunk(int rows) {
  std::fill(prefetched_buffer_.begin(), prefetched_buffer_.end(), -1);  // a chunk that failed midway left some
  for (std::vector<int>& experts : prefetched_) experts.clear();
  return staging_ && prefetches_layers(g_, rows);
}

// One part of the chunk's routes (the rows that read one stack of experts) through its experts, a group of rows
// per expert: gate and up, SwiGLU, down, each row unweighted (moe_weighted_rows weighs them per token).
void ChunkExperts::expert_rows(const CachedLayer& stacks, const ChunkRoutes::Part& part, const ChunkExpertRows& b,
                               cudaStream_t s) const {
  if (part.rows == 0) return;
  const long n = g_.n_embd, ff = g_.expert_ff, at = part.first_row;
  const kernels::MatmulGroups groups{b.group_slot + part.first_group, b.group_begin + part.begin_at, part.groups};
  const Q8Scratch x8 = kernels::q8_offset(b.ex_x8, at * n), h8 = kernels::q8_offset(b.ex_h8, at * ff);
  const kernels::MatmulRows in{part.rows, static_cast<int>(n), static_cast<int>(ff)};
  multiply_rows(stacks.gate, in, &groups, b.ex_x + at * n, x8, b.ex_gate + at * ff, s);
  multiply_rows(stacks.up, in, &groups, b.ex_x + at * n, x8, b.ex_up + at * ff, s);
  STRATA_CUDA_TRY(kernels::swiglu(b.ex_gate + at * ff, b.ex_up + at * ff, b.ex_hidden + at * ff, part.rows * ff, s,
                                  q8_for(stacks.down, h8)));
  multiply_rows(stacks.down, {part.rows, static_cast<int>(ff), static_cast<int>(n)}, &groups, b.ex_hidden + at * ff,
                h8, b.ex_rows + at * n, s);
}

// The CPU's share of the experts the chunk touches and the cache lacks: cpu_share_ of them, spread evenly over
// their ids (every expert of a layer has the same bytes), so that the pool reading them from host RAM and the
// staging copying the rest over PCIe finish together.
void ChunkExperts::choose_cpu_experts(const int* ids, int pairs) {
  std::vector<char> touched(g_.n_expert, 0);
  for (int p = 0; p < pairs; ++p) touched[ids[p]] = 1;
  on_cpu_.assign(g_.n_expert, 0);
  int seen = 0;
  for (int e = 0; e < g_.n_expert; ++e) {
    if (!touched[e] || (!cache_map_.empty() && cache_map_[e] >= 0)) continue;
    ++seen;
    // The seen-th uncached expert goes to the CPU when it moves floor(seen * share) up by one.
    on_cpu_[e] = static_cast<int>(seen * cpu_share_) > static_cast<int>((seen - 1) * cpu_share_);
  }
}

// The pool's part of the chunk's routes: its rows of x gathered on the host, run through their experts by the
// pool's workers, and the unweighted rows copied up into place beside the GPU's.
void ChunkExperts::pool_experts(int layer, const ChunkExpertRows& b, cudaStream_t s) {
  const ChunkRoutes::Part& part = routes_.cpu;
  const std::size_t n = g_.n_embd;
  const float* x = cpu_io_.host<float>();
  float* in = cpu_io_.host<float>(sizeof(float) * n * std::min(chunk_, cpu_rows_max_));
  float* out = in + n * cpu_rows_max_;
  for (int r = 0; r < part.rows; ++r) {
    std::memcpy(in + r * n, x + routes_.row_token[part.first_row + r] * n, sizeof(float) * n);
  }
  pool_->run_groups(layer, in, routes_.cpu_experts.data(), routes_.group_begin.data() + part.begin_at, part.groups,
                    out);
  STRATA_CUDA_TRY(cudaMemcpyAsync(b.ex_rows + static_cast<long>(part.first_row) * n, out,
                                  sizeof(float) * n * part.rows, cudaMemcpyHostToDevice, s));
  stats_.pooled_experts += part.groups;
}

void ChunkExperts::count_staged(int layer, std::size_t experts) {
  stats_.staged_experts += static_cast<long>(experts);
  stats_.staged_bytes += experts * staging_->expert_bytes(layer);
}

void ChunkExperts::prefetch_after(int layer) {
  for (int next = layer + 1; next < g_.n_layer; ++next) {
    if (t_.layers[next].router && !(cache_ && cache_->holds_all(next))) {
      prefetch(next);
      return;
    }
  }
}

// The experts of `layer` the cache lacks, copied whole into the next staging buffer ahead of its routing.
void ChunkExperts::prefetch(int layer) {
  if (prefetched_buffer_[layer] >= 0) return;  // fetched ahead already, past a layer the cache holds whole
  std::vector<int> experts;
  for (int e = 0; e < g_.n_expert; ++e) {
    if (!cache_ || cache_->slot_of(layer, e) < 0) experts.push_back(e);
  }
  if (experts.empty() || static_cast<int>(experts.size()) > staging_->slots()) return;
  const int buffer = next_buffer_;
  next_buffer_ = (next_buffer_ + 1) % ExpertStaging::kBuffers;
  staging_->fill(buffer, layer, experts);
  count_staged(layer, experts.size());
  prefetched_buffer_[layer] = buffer;
  prefetched_[layer] = std::move(experts);
}

void ChunkExperts::run(int layer, int rows, const ChunkExpertRows& b, cudaStream_t s) {
  const int k = g_.n_expert_used, pairs = rows * k, n = g_.n_embd;
  const bool all_cached = cache_ && cache_->holds_all(layer);
  STRATA_EXPECTS(all_cached || staging_, InvalidArgument,
                 "the prompt path needs the expert staging for layer " + std::to_string(layer) +
                     "'s routed experts, which the VRAM cache does not hold");
  int* host_ids = host_.host<int>();
  int* host_routes = host_.host<int>(routes_offset(g_, chunk_));
  STRATA_CUDA_TRY(cudaMemcpyAsync(host_ids, b.route_ids, sizeof(int) * pairs, cudaMemcpyDeviceToHost, s));
  const bool cpu_part = pool_ && prefetched_[layer].empty() && pairs <= cpu_rows_max_;
  if (cpu_part) {  // the chunk's x rows, for the pool's share
    STRATA_CUDA_TRY(cudaMemcpyAsync(cpu_io_.host<float>(), b.x, sizeof(float) * rows * n, cudaMemcpyDeviceToHost, s));
  }
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  cache_map_.clear();
  if (cache_ && layer < cache_->layers() && cache_->slots(layer) > 0) {
    cache_map_.resize(g_.n_expert);
    for (int e = 0; e < g_.n_expert; ++e) cache_map_[e] = cache_->slot_of(layer, e);
  }
  const int slots = staging_ ? staging_->slots() : 1;
  on_cpu_.clear();
  if (cpu_part) choose_cpu_experts(host_ids, pairs);  // after cache_map_: the cache keeps what it holds
  group_routes(host_ids, rows, k, g_.n_expert, cache_map_, on_cpu_, slots, prefetched_[layer], routes_);
  std::memcpy(host_routes, routes_.row_token.data(), sizeof(int) * pairs);
  std::memcpy(host_routes + pairs, routes_.row_of.data(), sizeof(int) * pairs);
  const std::size_t groups = routes_.group_slot.size(), begins = routes_.group_begin.size();
  std::memcpy(host_routes + 2 * pairs, routes_.group_slot.data(), sizeof(int) * groups);
  std::memcpy(host_routes + 3 * pairs, routes_.group_begin.data(), sizeof(int) * begins);
  STRATA_CUDA_TRY(cudaMemcpyAsync(b.row_token, host_routes, sizeof(int) * pairs, cudaMemcpyHostToDevice, s));
  STRATA_CUDA_TRY(cudaMemcpyAsync(b.row_of, host_routes + pairs, sizeof(int) * pairs, cudaMemcpyHostToDevice, s));
  STRATA_CUDA_TRY(cudaMemcpyAsync(b.group_slot, host_routes + 2 * pairs, sizeof(int) * groups, cudaMemcpyHostToDevice,
                                  s));
  STRATA_CUDA_TRY(cudaMemcpyAsync(b.group_begin, host_routes + 3 * pairs, sizeof(int) * begins,
                                  cudaMemcpyHostToDevice, s));
  STRATA_CUDA_TRY(kernels::gather_rows(b.x, b.row_token, pairs, n, b.ex_x, s));
  quantize(b.ex_x, static_cast<long>(pairs) * n, b.ex_x8, s);  // unread where the experts' gate and up are float
  if (routes_.cached_rows > 0) expert_rows(cache_->layer(layer), routes_.cached, b, s);
  for (const ChunkRoutes::Fill& fill : routes_.fills) {
    int buffer = prefetched_buffer_[layer];
    const CachedLayer* stacks = nullptr;
    if (buffer < 0) {
      buffer = next_buffer_;
      next_buffer_ = (next_buffer_ + 1) % ExpertStaging::kBuffers;
      stacks = &staging_->fill(buffer, layer, fill.experts);
      count_staged(layer, fill.experts.size());
    } else {
      stacks = &staging_->stacks(buffer);
    }
    staging_->await(buffer, s);
    expert_rows(*stacks, fill.part, b, s);
    staging_->release(buffer, s);
  }
  if (routes_.cpu.rows > 0) pool_experts(layer, b, s);  // on the host, while the GPU computes the other parts
  stats_.cached_experts += routes_.cached_experts;
  prefetched_buffer_[layer] = -1;
  prefetched_[layer].clear();
  STRATA_CUDA_TRY(kernels::moe_weighted_rows(b.ex_rows, b.row_of, b.route_weights, rows, k, n, b.routed, s));
}

}  // namespace strata
