#include "strata/expert_cache.hpp"

#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "../runtime/device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata {
namespace {

std::string str(long long v) { return std::to_string(v); }

const cpu::Plane* planes_of(const cpu::ExpertMatrix& m, int i) {
  const cpu::Plane* all[5] = {&m.codes, &m.d, &m.sub_scales, &m.mins, &m.sub_mins};
  return all[i];
}

// One expert's bytes of plane i of `m` (the pool's planes are expert-major, so expert e's are the e-th slice).
std::size_t expert_plane_bytes(const cpu::ExpertMatrix& m, int i) {
  return static_cast<std::size_t>(planes_of(m, i)->nbytes / m.n_expert);
}

// The pages wholly inside plane `p`: what the cache page-locks of it for replacement copies ([begin, end)).
std::pair<std::uintptr_t, std::uintptr_t> locked_pages(const cpu::Plane& p) {
  static const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto data = reinterpret_cast<std::uintptr_t>(p.data);
  return {(data + page - 1) / page * page, (data + p.nbytes) / page * page};
}

// Bytes a layer of `slots` slots takes: the map, then every plane of gate, up and down for all slots.
std::size_t layer_bytes(const cpu::LayerMatrices& l, int slots) {
  std::size_t bytes = plane_aligned(sizeof(int) * l.gate.n_expert);
  for (const cpu::ExpertMatrix* m : {&l.gate, &l.up, &l.down}) {
    for (int i = 0; i < 5; ++i) {
      if (const std::size_t b = expert_plane_bytes(*m, i)) bytes += plane_aligned(b * slots);
    }
  }
  return bytes;
}

void check_slots(const cpu::ExpertPool& pool, const std::vector<int>& slots) {
  STRATA_EXPECTS(static_cast<int>(slots.size()) <= pool.layers(), InvalidArgument,
                 "expert cache: slots for " + str(slots.size()) + " layers, the pool has " + str(pool.layers()));
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] == 0) continue;
    STRATA_EXPECTS(pool.has_layer(l), InvalidArgument,
                   "expert cache: layer " + str(l) + " has " + str(slots[l]) + " slots but no experts in the pool");
    const int n_expert = static_cast<int>(pool.layer_matrices(l).gate.n_expert);
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
  };
  struct Copy {
    ExpertMove move;
    cudaEvent_t done = nullptr;
  };
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
  void copy_experts(int layer, int slot, int first, int count, cudaStream_t stream) {
    const Layer& l = layers[layer];
    const cpu::ExpertMatrix* host[3] = {&l.host.gate, &l.host.up, &l.host.down};
    const DeviceTensor* dev[3] = {&l.device.gate, &l.device.up, &l.device.down};
    for (int m = 0; m < 3; ++m) {
      for (int i = 0; i < 5; ++i) {
        const std::size_t b = expert_plane_bytes(*host[m], i);
        if (b == 0) continue;
        char* to = static_cast<char*>(const_cast<void*>(plane_of(*dev[m], i))) + b * slot;
        const cpu::Plane& plane = *planes_of(*host[m], i);
        const auto from = reinterpret_cast<std::uintptr_t>(plane.data) + b * first, end = from + b * count;
        // A copy may not straddle locked and unlocked pages (the runtime refuses it): cut at the locked
        // interior's edges, so that each piece is all one or the other.
        const auto [lo, hi] = locked_pages(plane);
        const std::uintptr_t cuts[4] = {from, std::clamp(lo, from, end), std::clamp(std::max(lo, hi), from, end), end};
        for (int piece = 0; piece < 3; ++piece) {
          if (cuts[piece + 1] == cuts[piece]) continue;
          STRATA_CUDA_TRY(cudaMemcpyAsync(to + (cuts[piece] - from), reinterpret_cast<const void*>(cuts[piece]),
                                          cuts[piece + 1] - cuts[piece], cudaMemcpyHostToDevice, stream));
        }
      }
    }
  }

  // Page-locks the host planes of `layers` for the copies: only the pages wholly inside a plane, never a page
  // it shares with memory the cache does not own (the heap may unmap such a page and reuse the addresses under a
  // registration). The part of a copy outside the locked pages (an edge expert of a plane) is staged by the
  // driver: slower, as correct. So is one from pages another cache of the pool locked first and then let go.
  void pin(const std::vector<const cpu::LayerMatrices*>& layers) {
    for (const cpu::LayerMatrices* m : layers) {
      for (const cpu::ExpertMatrix* matrix : {&m->gate, &m->up, &m->down}) {
        for (int i = 0; i < 5; ++i) {
          const cpu::Plane* p = planes_of(*matrix, i);
          const auto [begin, end] = locked_pages(*p);
          if (p->nbytes == 0 || end <= begin) continue;
          void* at = reinterpret_cast<void*>(begin);
          const cudaError_t e = cudaHostRegister(at, end - begin, cudaHostRegisterDefault);
          if (e == cudaErrorHostMemoryAlreadyRegistered) {  // another cache of the same pool locked it
            (void)cudaGetLastError();
            continue;
          }
          STRATA_EXPECTS(e == cudaSuccess, Error,
                         "expert cache: page-locking " + str(end - begin) + " bytes of routed expert weights for "
                             "the replacement copies failed (" + cudaGetErrorString(e) + "); raise the locked-memory "
                             "limit (ulimit -l) or use the static cache policy");
          pinned.push_back(at);
        }
      }
    }
  }
};

std::size_t ExpertCache::bytes_for(const cpu::ExpertPool& pool, const std::vector<int>& slots) {
  check_slots(pool, slots);
  std::size_t bytes = 0;
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] > 0) bytes += layer_bytes(pool.layer_matrices(l), slots[l]);
  }
  return bytes;
}

ExpertCache::ExpertCache(int device, const cpu::ExpertPool& pool, const std::vector<int>& slots,
                         const PolicyOptions& policy) {
  const std::size_t bytes = bytes_for(pool, slots);
  int n_expert = 1;
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    if (slots[l] > 0) n_expert = static_cast<int>(pool.layer_matrices(l).gate.n_expert);
  }
  impl_ = std::make_unique<Impl>(slots, n_expert, policy);
  Impl& c = *impl_;
  c.device = device;
  c.bytes = bytes;
  c.layers.resize(slots.size());
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(c.bytes, device, "the expert cache", "a smaller expert cache needs less");
  STRATA_CUDA_TRY(cudaMalloc(&c.arena, std::max<std::size_t>(c.bytes, 1)));
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&c.copies, cudaStreamNonBlocking));
  std::vector<const cpu::LayerMatrices*> replaced;  // partly cached layers with replacement: pinned below
  char* cursor = static_cast<char*>(c.arena);
  auto take = [&cursor](std::size_t b) {
    char* at = cursor;
    cursor += plane_aligned(b);
    return at;
  };
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    Impl::Layer& layer = c.layers[l];
    if (slots[l] == 0) continue;
    layer.host = pool.layer_matrices(l);
    STRATA_EXPECTS(layer.host.gate.n_expert == n_expert, InvalidArgument,
                   "expert cache: layer " + str(l) + " has " + str(layer.host.gate.n_expert) + " experts, another " +
                       str(n_expert));
    layer.map.assign(n_expert, -1);
    layer.slot_of = reinterpret_cast<int*>(take(sizeof(int) * n_expert));
    STRATA_CUDA_TRY(cudaMemcpy(layer.slot_of, layer.map.data(), sizeof(int) * n_expert, cudaMemcpyHostToDevice));
    layer.device.slots = slots[l];
    layer.device.slot_of = layer.slot_of;
    const cpu::ExpertMatrix* host[3] = {&layer.host.gate, &layer.host.up, &layer.host.down};
    DeviceTensor* dev[3] = {&layer.device.gate, &layer.device.up, &layer.device.down};
    for (int m = 0; m < 3; ++m) {
      const void* placed[5] = {};
      for (int i = 0; i < 5; ++i) {
        if (const std::size_t b = expert_plane_bytes(*host[m], i)) placed[i] = take(b * slots[l]);
      }
      *dev[m] = placed_tensor(host[m]->is_float, host[m]->float_kind, host[m]->form, host[m]->rows, host[m]->cols,
                              placed);
    }
    if (policy.replace && slots[l] < n_expert) replaced.push_back(&layer.host);
  }
  c.pin(replaced);
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
  // Runs of consecutive ids are one copy each: a layer held whole is one copy per plane.
  for (int s = 0, n = static_cast<int>(experts.size()), run; s < n; s += run) {
    for (run = 1; s + run < n && experts[s + run] == experts[s] + run;) ++run;
    c.copy_experts(layer, s, experts[s], run, nullptr);
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
    c.copy_experts(move.layer, move.slot, move.expert, 1, c.copies);
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

std::size_t ExpertCache::expert_bytes(int layer) const {
  const Impl::Layer& l = impl_->at(layer);
  std::size_t bytes = 0;
  for (const cpu::ExpertMatrix* m : {&l.host.gate, &l.host.up, &l.host.down}) {
    for (int i = 0; i < 5; ++i) bytes += m->n_expert ? expert_plane_bytes(*m, i) : 0;
  }
  return bytes;
}

int ExpertCache::layers() const noexcept { return static_cast<int>(impl_->layers.size()); }
int ExpertCache::n_expert(int layer) const { return static_cast<int>(impl_->at(layer).map.size()); }
int ExpertCache::slots(int layer) const { return impl_->at(layer).device.slots; }

bool ExpertCache::holds(int layer, int expert) const noexcept {
  if (layer < 0 || layer >= layers() || impl_->layers[layer].device.slots == 0) return false;
  return impl_->policy.slot_of(layer, expert) >= 0;
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
