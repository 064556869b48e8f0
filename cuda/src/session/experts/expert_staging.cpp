#include "strata/expert_staging.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "../../runtime/device_buffer.hpp"
#include "expert_planes.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata {
namespace {

std::string str(long long v) { return std::to_string(v); }

std::vector<cpu::LayerMatrices> pool_layers(const cpu::ExpertPool& pool) {
  std::vector<cpu::LayerMatrices> layers(pool.layers());
  for (int l = 0; l < pool.layers(); ++l) {
    if (pool.has_layer(l)) layers[l] = pool.layer_matrices(l);
  }
  return layers;
}

std::size_t buffer_bytes(const std::vector<cpu::LayerMatrices>& layers, int slots) {
  std::size_t bytes = 0;
  for (const cpu::LayerMatrices& l : layers) bytes = std::max(bytes, stacks_bytes(l, slots));
  return bytes;
}

int pool_experts(const std::vector<cpu::LayerMatrices>& layers) {
  int n = 0;
  for (const cpu::LayerMatrices& l : layers) n = std::max(n, static_cast<int>(l.gate.n_expert));
  return n;
}

}  // namespace

struct ExpertStaging::Impl {
  int device = 0, slots = 0, n_expert = 0;
  std::vector<cpu::LayerMatrices> layers;
  std::size_t buffer_bytes = 0;
  void* arena = nullptr;
  cudaStream_t copies = nullptr;
  cudaEvent_t released[kBuffers] = {}, filled[kBuffers] = {};
  CachedLayer view[kBuffers];
  double copy_rate = 0.0;
  std::vector<void*> pinned;

  ~Impl() {
    if (copies) (void)cudaStreamSynchronize(copies);
    for (int b = 0; b < kBuffers; ++b) {
      if (released[b]) (void)cudaEventDestroy(released[b]);
      if (filled[b]) (void)cudaEventDestroy(filled[b]);
    }
    if (copies) (void)cudaStreamDestroy(copies);
    for (void* p : pinned) (void)cudaHostUnregister(p);
    if (arena) (void)cudaFree(arena);
  }
};

std::size_t ExpertStaging::bytes_for(const cpu::ExpertPool& pool, int slots) {
  const std::vector<cpu::LayerMatrices> layers = pool_layers(pool);
  const int n_expert = pool_experts(layers);
  STRATA_EXPECTS(n_expert > 0, InvalidArgument, "expert staging: the pool has no layer of routed experts");
  STRATA_EXPECTS(slots >= 1 && slots <= n_expert, InvalidArgument,
                 "expert staging: slots must be in 1.." + str(n_expert) + ", got " + str(slots));
  return kBuffers * buffer_bytes(layers, slots);
}

ExpertStaging::ExpertStaging(int device, const cpu::ExpertPool& pool, int slots) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  const std::size_t total = bytes_for(pool, slots);
  s.device = device;
  s.slots = slots;
  s.layers = pool_layers(pool);
  s.n_expert = pool_experts(s.layers);
  s.buffer_bytes = total / kBuffers;
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(total, device, "the prompt path's expert staging", "fewer staging slots need less");
  STRATA_CUDA_TRY(cudaMalloc(&s.arena, total));
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s.copies, cudaStreamNonBlocking));
  for (int b = 0; b < kBuffers; ++b) {
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&s.released[b], cudaEventDisableTiming));
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&s.filled[b], cudaEventDisableTiming));
  }
  std::vector<cpu::LayerMatrices> moe;
  for (const cpu::LayerMatrices& l : s.layers) {
    if (l.gate.n_expert > 0) moe.push_back(l);
  }
  s.pinned = pin_planes(moe, "expert staging");
  time_copies();
}

// The first MoE layer's first `slots` experts copied into buffer 0 and timed: what the cost model prices the
// staging's bytes at.
void ExpertStaging::time_copies() {
  Impl& s = *impl_;
  int layer = 0;
  while (s.layers[layer].gate.n_expert == 0) ++layer;
  std::vector<int> experts(s.slots);
  for (int e = 0; e < s.slots; ++e) experts[e] = e;
  cudaEvent_t start = nullptr, stop = nullptr;
  STRATA_CUDA_TRY(cudaEventCreate(&start));
  STRATA_CUDA_TRY(cudaEventCreate(&stop));
  float ms = 0.0f;
  const cudaError_t status = [&] {
    cudaError_t e = cudaEventRecord(start, s.copies);
    if (e == cudaSuccess) fill(0, layer, experts);
    if (e == cudaSuccess) e = cudaEventRecord(stop, s.copies);
    if (e == cudaSuccess) e = cudaEventSynchronize(stop);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
    return e;
  }();
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  STRATA_CUDA_TRY(status);
  s.copy_rate = ms > 0.0f ? expert_bytes(layer) * experts.size() / (ms * 1e-3) : 0.0;
}

ExpertStaging::~ExpertStaging() = default;

const CachedLayer& ExpertStaging::fill(int buffer, int layer, const std::vector<int>& experts) {
  Impl& s = *impl_;
  STRATA_EXPECTS(buffer >= 0 && buffer < kBuffers, InvalidArgument, "expert staging: no buffer " + str(buffer));
  STRATA_EXPECTS(layer >= 0 && layer < static_cast<int>(s.layers.size()) && s.layers[layer].gate.n_expert > 0,
                 InvalidArgument, "expert staging: layer " + str(layer) + " has no routed experts in the pool");
  STRATA_EXPECTS(static_cast<int>(experts.size()) <= s.slots, InvalidArgument,
                 "expert staging: " + str(experts.size()) + " experts for " + str(s.slots) + " slots");
  const cpu::LayerMatrices& host = s.layers[layer];
  const ExpertStacks stacks = carve_stacks(host, s.slots, static_cast<char*>(s.arena) + buffer * s.buffer_bytes);
  STRATA_CUDA_TRY(cudaStreamWaitEvent(s.copies, s.released[buffer], 0));
  // Runs of consecutive ids are one copy per plane each: a whole layer is one.
  for (int i = 0, n = static_cast<int>(experts.size()), run; i < n; i += run) {
    STRATA_EXPECTS(experts[i] >= 0 && experts[i] < host.gate.n_expert, InvalidArgument,
                   "expert staging: layer " + str(layer) + " has no expert " + str(experts[i]));
    for (run = 1; i + run < n && experts[i + run] == experts[i] + run;) ++run;
    copy_experts(host, stacks, i, experts[i], run, s.copies);
  }
  STRATA_CUDA_TRY(cudaEventRecord(s.filled[buffer], s.copies));
  CachedLayer& view = s.view[buffer];
  view.slots = s.slots;
  view.gate = stacks.gate;
  view.up = stacks.up;
  view.down = stacks.down;
  view.slot_of = nullptr;
  return view;
}

const CachedLayer& ExpertStaging::stacks(int buffer) const {
  STRATA_EXPECTS(buffer >= 0 && buffer < kBuffers, InvalidArgument, "expert staging: no buffer " + str(buffer));
  return impl_->view[buffer];
}

void ExpertStaging::await(int buffer, CUstream_st* compute) {
  STRATA_EXPECTS(buffer >= 0 && buffer < kBuffers, InvalidArgument, "expert staging: no buffer " + str(buffer));
  STRATA_CUDA_TRY(cudaStreamWaitEvent(compute, impl_->filled[buffer], 0));
}

void ExpertStaging::release(int buffer, CUstream_st* compute) {
  STRATA_EXPECTS(buffer >= 0 && buffer < kBuffers, InvalidArgument, "expert staging: no buffer " + str(buffer));
  STRATA_CUDA_TRY(cudaEventRecord(impl_->released[buffer], compute));
}


std::size_t ExpertStaging::expert_bytes(int layer) const { return strata::expert_bytes(impl_->layers.at(layer)); }

double ExpertStaging::copy_rate() const noexcept { return impl_->copy_rate; }
int ExpertStaging::slots() const noexcept { return impl_->slots; }
int ExpertStaging::n_expert() const noexcept { return impl_->n_expert; }
std::size_t ExpertStaging::bytes() const noexcept { return impl_->buffer_bytes * kBuffers; }
int ExpertStaging::device() const noexcept { return impl_->device; }

}  // namespace strata
