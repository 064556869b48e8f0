#include "strata/expert_cache.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "../../runtime/device_buffer.hpp"
#include "../../runtime/pinned_memory.hpp"
#include "expert_planes.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata {
namespace {

std::string str(long long v) { return std::to_string(v); }

// Bytes a layer of `slots` slots takes: the map, then the stacks.
std::size_t layer_bytes(const cpu::LayerMatrices& l, int slots) {
  return plane_aligned(sizeof(int) * l.gate.n_expert) + stacks_bytes(l, slots);
}

void check_slots(const cpu::ExpertPool& pool, const std::vector<int>& slots) {
  STRATA_EXPECTS(static_cast<int>(slots.size()) <= pool.layers(), InvalidArgument,
                 "expert cache: slots for " + str(slots.size()) + " layers, the pool has " + str(pool.layers()));
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] == 0) continue;
    STRATA_EXPECTS(pool.has_layer(l), InvalidArgument,
                   "expert cache: layer " + str(l) + " has " + str(slots[l]) + " slots but no experts in the pool");
    const int n_expert = static_cast<int>(pool.layer_forms(l).gate.n_expert);
    STRATA_EXPECTS(slots[l] >= 0 && slots[l] <= n_expert, InvalidArgument,
                   "expert cache: layer " + str(l) + " slots must be in 0.." + str(n_expert) + ", got " +
                       str(slots[l]));
  }
}

}  // namespace

struct ExpertCache::Impl {
  struct Layer {
    cpu::LayerMatrices host;
    CachedLayer device;
    int* slot_of = nullptr;   // device
    std::vector<int> map;     // the host's copy of slot_of, as last uploaded
    bool whole = false;       // every expert held (no miss ever, so no replacement either)
    bool tiered = false;      // the pool reads its experts (read_expert): held static
  };
  struct Copy {
    ExpertMove move;
    cudaEvent_t done = nullptr;
  };
  cpu::ExpertPool* pool = nullptr;
  int device = 0;
  std::size_t bytes = 0;
  void* arena = nullptr;
  std::vector<Layer> layers;
  ReplacementPolicy policy;
  cudaStream_t copies = nullptr;        // replacement copies, beside the tokens
  std::vector<Copy> in_flight;
  std::vector<cudaEvent_t> spare_events;
  std::vector<void*> pinned;            // host planes page-locked for the copies

  Impl(const std::vector<int>& slots, int n_expert, const PolicyOptions& options) : policy(slots, n_expert, options) {}

  ~Impl() {
    if (copies) (void)cudaStreamSynchronize(copies);
    for (Copy& c : in_flight) (void)cudaEventDestroy(c.done);
    for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
    if (copies) (void)cudaStreamDestroy(copies);
    for (void* p : pinned) (void)cudaHostUnregister(p);
    if (arena) (void)cudaFree(arena);
  }

  const Layer& at(int layer) const {
    STRATA_EXPECTS(layer >= 0 && layer < static_cast<int>(layers.size()), InvalidArgument,
                   "expert cache: layer " + str(layer) + " is outside 0.." + str(static_cast<int>(layers.size()) - 1));
    return layers[layer];
  }

  // The device map of `layer` from the policy's, enqueued on `stream` (the host copy is staged by the call).
  void upload_map(int layer, cudaStream_t stream) {
    Layer& l = layers[layer];
    for (int e = 0; e < static_cast<int>(l.map.size()); ++e) l.map[e] = policy.slot_of(layer, e);
    STRATA_CUDA_TRY(cudaMemcpyAsync(l.slot_of, l.map.data(), sizeof(int) * l.map.size(), cudaMemcpyHostToDevice,
                                    stream));
  }

  // Enqueues the planes of `count` consecutive experts from `first` into `layer`'s slots from `slot` on.
  void copy(int layer, int slot, int first, int count, cudaStream_t stream) {
    const Layer& l = layers[layer];
    copy_experts(l.host, {l.device.gate, l.device.up, l.device.down}, slot, first, count, stream);
  }
};

std::size_t ExpertCache::bytes_for(const cpu::ExpertPool& pool, const std::vector<int>& slots) {
  check_slots(pool, slots);
  std::size_t bytes = 0;
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] > 0) bytes += layer_bytes(pool.layer_forms(l), slots[l]);
  }
  return bytes;
}

ExpertCache::ExpertCache(int device, cpu::ExpertPool& pool, const std::vector<int>& slots,
                         const PolicyOptions& policy) {
  const std::size_t bytes = bytes_for(pool, slots);
  int n_expert = 1;
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] > 0) n_expert = static_cast<int>(pool.layer_forms(l).gate.n_expert);
  }
  impl_ = std::make_unique<Impl>(slots, n_expert, policy);
  Impl& c = *impl_;
  c.pool = &pool;
  c.device = device;
  c.bytes = bytes;
  c.layers.resize(slots.size());
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(c.bytes, device, "the expert cache", "a smaller expert cache needs less");
  STRATA_CUDA_TRY(cudaMalloc(&c.arena, std::max<std::size_t>(c.bytes, 1)));
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&c.copies, cudaStreamNonBlocking));
  std::vector<cpu::LayerMatrices> replaced;  // partly cached layers with replacement: pinned below
  char* cursor = static_cast<char*>(c.arena);
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    Impl::Layer& layer = c.layers[l];
    if (slots[l] == 0) continue;
    layer.host = pool.layer_forms(l);
    layer.tiered = pool.is_tiered(l);
    STRATA_EXPECTS(!(layer.tiered && policy.replace && slots[l] < n_expert), InvalidArgument,
                   "expert cache: layer " + str(l) + " is tiered (part of its experts on disk, docs/tiers.md): its " +
                       str(slots[l]) + " slots are held static; use the static cache policy");
    STRATA_EXPECTS(layer.host.gate.n_expert == n_expert, InvalidArgument,
                   "expert cache: layer " + str(l) + " has " + str(layer.host.gate.n_expert) + " experts, another " +
                       str(n_expert));
    layer.map.assign(n_expert, -1);
    layer.slot_of = reinterpret_cast<int*>(cursor);
    cursor += plane_aligned(sizeof(int) * n_expert);
    STRATA_CUDA_TRY(cudaMemcpy(layer.slot_of, layer.map.data(), sizeof(int) * n_expert, cudaMemcpyHostToDevice));
    layer.device.slots = slots[l];
    layer.device.slot_of = layer.slot_of;
    const ExpertStacks stacks = carve_stacks(layer.host, slots[l], cursor);
    cursor += stacks_bytes(layer.host, slots[l]);
    layer.device.gate = stacks.gate;
    layer.device.up = stacks.up;
    layer.device.down = stacks.down;
    if (policy.replace && slots[l] < n_expert) replaced.push_back(layer.host);
  }
  c.pinned = pin_planes(replaced, "expert cache (or use the static cache policy)");
}

ExpertCache::~ExpertCache() = default;

void ExpertCache::hold(int layer, const std::vector<int>& experts) {
  Impl& c = *impl_;
  c.at(layer);
  Impl::Layer& l = c.layers[layer];
  STRATA_EXPECTS(static_cast<int>(experts.size()) <= l.device.slots, InvalidArgument,
                 "expert cache: layer " + str(layer) + " has " + str(l.device.slots) + " slots, asked to hold " +
                     str(experts.size()) + " experts");
  const int n_expert = static_cast<int>(l.map.size());
  std::vector<bool> seen(n_expert, false);
  for (const int e : experts) {
    STRATA_EXPECTS(e >= 0 && e < n_expert, InvalidArgument,
                   "expert cache: layer " + str(layer) + " expert " + str(e) + " is outside 0.." + str(n_expert - 1));
    STRATA_EXPECTS(!seen[e], InvalidArgument,
                   "expert cache: layer " + str(layer) + " expert " + str(e) + " asked for twice");
    seen[e] = true;
  }
  DeviceScope scope(c.device);
  STRATA_CUDA_TRY(cudaStreamSynchronize(c.copies));  // no replacement copy may land in a slot being refilled
  // The map goes first, emptied: an interrupted hold leaves the layer holding nothing rather than a slot whose
  // bytes are half one expert's.
  c.policy.hold(layer, {});
  c.upload_map(layer, nullptr);
  if (l.tiered) {  // each expert through the pool, one at a time through a page-locked bounce
    PinnedMapped bounce(strata::expert_bytes(l.host));
    const ExpertStacks to{l.device.gate, l.device.up, l.device.down};
    for (int s = 0; s < static_cast<int>(experts.size()); ++s) {
      c.pool->read_expert(layer, experts[s], bounce.host<std::uint8_t>());
      copy_packed_expert(l.host, to, s, bounce.host<std::uint8_t>(), nullptr);
      STRATA_CUDA_TRY(cudaDeviceSynchronize());  // the bounce is read before the next expert lands in it
    }
  } else {
    // Runs of consecutive ids are one copy each: a layer held whole is one copy per plane.
    for (int s = 0, n = static_cast<int>(experts.size()), run; s < n; s += run) {
      for (run = 1; s + run < n && experts[s + run] == experts[s] + run;) ++run;
      c.copy(layer, s, experts[s], run, nullptr);
    }
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  c.policy.hold(layer, experts);
  c.upload_map(layer, nullptr);
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  l.whole = static_cast<int>(experts.size()) == n_expert;
}

void ExpertCache::note_routed(int layer, const std::int32_t* ids, int k) {
  if (layer >= 0 && layer < layers() && impl_->layers[layer].device.slots > 0) impl_->policy.note(layer, ids, k);
}

std::vector<ExpertMove> ExpertCache::between_tokens(CUstream_st* token_stream) {
  Impl& c = *impl_;
  if (!c.policy.options().replace) return {};
  DeviceScope scope(c.device);
  std::vector<bool> dirty(c.layers.size(), false);
  for (Impl::Copy& copy : c.in_flight) {  // begun before the previous token: done long since, as a rule
    STRATA_CUDA_TRY(cudaEventSynchronize(copy.done));
    c.policy.complete(copy.move);
    dirty[copy.move.layer] = true;
    c.spare_events.push_back(copy.done);
  }
  c.in_flight.clear();
  std::vector<ExpertMove> moves = c.policy.plan();
  for (const ExpertMove& move : moves) {
    dirty[move.layer] = true;  // the evicted expert leaves the map before the next token reads it
    c.copy(move.layer, move.slot, move.expert, 1, c.copies);
    Impl::Copy copy{move, nullptr};
    if (c.spare_events.empty()) {
      STRATA_CUDA_TRY(cudaEventCreateWithFlags(&copy.done, cudaEventDisableTiming));
    } else {
      copy.done = c.spare_events.back();
      c.spare_events.pop_back();
    }
    STRATA_CUDA_TRY(cudaEventRecord(copy.done, c.copies));
    c.in_flight.push_back(copy);
  }
  for (int l = 0; l < static_cast<int>(dirty.size()); ++l) {
    if (dirty[l]) c.upload_map(l, token_stream);
  }
  return moves;
}

std::size_t ExpertCache::expert_bytes(int layer) const { return strata::expert_bytes(impl_->at(layer).host); }

int ExpertCache::layers() const noexcept { return static_cast<int>(impl_->layers.size()); }
int ExpertCache::n_expert(int layer) const { return static_cast<int>(impl_->at(layer).map.size()); }
int ExpertCache::slots(int layer) const { return impl_->at(layer).device.slots; }

bool ExpertCache::holds(int layer, int expert) const noexcept {
  return slot_of(layer, expert) >= 0;
}

int ExpertCache::slot_of(int layer, int expert) const noexcept {
  if (layer < 0 || layer >= layers() || impl_->layers[layer].device.slots == 0) return -1;
  return impl_->policy.slot_of(layer, expert);
}

bool ExpertCache::holds_all(int layer) const noexcept {
  return layer >= 0 && layer < layers() && impl_->layers[layer].whole;
}

std::vector<int> ExpertCache::held(int layer) const {
  std::vector<int> out(impl_->at(layer).device.slots);
  for (int s = 0; s < static_cast<int>(out.size()); ++s) out[s] = impl_->policy.expert_in(layer, s);
  return out;
}
const CachedLayer& ExpertCache::layer(int index) const { return impl_->at(index).device; }
std::size_t ExpertCache::bytes() const noexcept { return impl_->bytes; }
int ExpertCache::device() const noexcept { return impl_->device; }

}  // namespace strata
