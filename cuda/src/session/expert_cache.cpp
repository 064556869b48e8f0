#include "strata/expert_cache.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "../runtime/device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata {
namespace {

constexpr std::size_t kAlign = 256;  // as the dense weights: every plane starts on a 256-byte boundary

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::string str(long long v) { return std::to_string(v); }

const cpu::Plane* planes_of(const cpu::ExpertMatrix& m, int i) {
  const cpu::Plane* all[5] = {&m.codes, &m.d, &m.sub_scales, &m.mins, &m.sub_mins};
  return all[i];
}

// One expert's bytes of plane i of `m` (the pool's planes are expert-major, so expert e's are the e-th slice).
std::size_t expert_plane_bytes(const cpu::ExpertMatrix& m, int i) {
  return static_cast<std::size_t>(planes_of(m, i)->nbytes / m.n_expert);
}

// Bytes a layer of `slots` slots takes: the map, then every plane of gate, up and down for all slots.
std::size_t layer_bytes(const cpu::LayerMatrices& l, int slots) {
  std::size_t bytes = aligned(sizeof(int) * l.gate.n_expert);
  for (const cpu::ExpertMatrix* m : {&l.gate, &l.up, &l.down}) {
    for (int i = 0; i < 5; ++i) {
      if (const std::size_t b = expert_plane_bytes(*m, i)) bytes += aligned(b * slots);
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
    int* slot_of = nullptr;           // device
    std::vector<int> slot_of_host;    // [n_expert]
    std::vector<int> expert_in_slot;  // [slots]
  };
  int device = 0;
  std::size_t bytes = 0;
  void* arena = nullptr;
  std::vector<Layer> layers;

  ~Impl() {
    if (arena) (void)cudaFree(arena);
  }

  const Layer& at(int layer) const {
    STRATA_EXPECTS(layer >= 0 && layer < static_cast<int>(layers.size()), InvalidArgument,
                   "expert cache: layer " + str(layer) + " is outside 0.." + str(static_cast<int>(layers.size()) - 1));
    return layers[layer];
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

ExpertCache::ExpertCache(int device, const cpu::ExpertPool& pool, const std::vector<int>& slots)
    : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  c.device = device;
  c.bytes = bytes_for(pool, slots);
  c.layers.resize(slots.size());
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(c.bytes, device, "the expert cache", "a smaller expert cache needs less");
  STRATA_CUDA_TRY(cudaMalloc(&c.arena, std::max<std::size_t>(c.bytes, 1)));
  char* cursor = static_cast<char*>(c.arena);
  auto take = [&cursor](std::size_t b) {
    char* at = cursor;
    cursor += aligned(b);
    return at;
  };
  for (int l = 0; l < static_cast<int>(slots.size()); ++l) {
    Impl::Layer& layer = c.layers[l];
    if (slots[l] == 0) continue;
    layer.host = pool.layer_matrices(l);
    const int n_expert = static_cast<int>(layer.host.gate.n_expert);
    layer.slot_of_host.assign(n_expert, -1);
    layer.expert_in_slot.assign(slots[l], -1);
    layer.slot_of = reinterpret_cast<int*>(take(sizeof(int) * n_expert));
    STRATA_CUDA_TRY(cudaMemcpy(layer.slot_of, layer.slot_of_host.data(), sizeof(int) * n_expert,
                               cudaMemcpyHostToDevice));
    layer.device.slots = slots[l];
    layer.device.slot_of = layer.slot_of;
    const cpu::ExpertMatrix* host[3] = {&layer.host.gate, &layer.host.up, &layer.host.down};
    DeviceTensor* dev[3] = {&layer.device.gate, &layer.device.up, &layer.device.down};
    for (int m = 0; m < 3; ++m) {
      const void* placed[5] = {};
      for (int i = 0; i < 5; ++i) {
        if (const std::size_t b = expert_plane_bytes(*host[m], i)) placed[i] = take(b * slots[l]);
      }
      DeviceTensor& d = *dev[m];
      d.is_float = host[m]->is_float;
      d.float_kind = host[m]->float_kind;
      d.form = host[m]->form;
      d.rows = host[m]->rows;
      d.cols = host[m]->cols;
      d.data = placed[0];
      d.planes = QuantPlanes{static_cast<const std::uint8_t*>(placed[0]), placed[1],
                             static_cast<const std::int8_t*>(placed[2]), static_cast<const std::uint16_t*>(placed[3]),
                             static_cast<const std::uint8_t*>(placed[4])};
    }
  }
}

ExpertCache::~ExpertCache() = default;

void ExpertCache::hold(int layer, const std::vector<int>& experts) {
  Impl& c = *impl_;
  c.at(layer);
  Impl::Layer& l = c.layers[layer];
  const int slots = l.device.slots, n_expert = static_cast<int>(l.slot_of_host.size());
  STRATA_EXPECTS(static_cast<int>(experts.size()) <= slots, InvalidArgument,
                 "expert cache: layer " + str(layer) + " has " + str(slots) + " slots, asked to hold " +
                     str(experts.size()) + " experts");
  std::vector<int> slot_of(n_expert, -1);
  for (int s = 0; s < static_cast<int>(experts.size()); ++s) {
    const int e = experts[s];
    STRATA_EXPECTS(e >= 0 && e < n_expert, InvalidArgument,
                   "expert cache: layer " + str(layer) + " expert " + str(e) + " is outside 0.." + str(n_expert - 1));
    STRATA_EXPECTS(slot_of[e] < 0, InvalidArgument,
                   "expert cache: layer " + str(layer) + " expert " + str(e) + " asked for twice");
    slot_of[e] = s;
  }
  DeviceScope scope(c.device);
  const cpu::ExpertMatrix* host[3] = {&l.host.gate, &l.host.up, &l.host.down};
  const DeviceTensor* dev[3] = {&l.device.gate, &l.device.up, &l.device.down};
  // The map goes first, emptied: an interrupted hold leaves the layer holding nothing rather than a slot whose
  // bytes are half one expert's.
  std::fill(l.slot_of_host.begin(), l.slot_of_host.end(), -1);
  std::fill(l.expert_in_slot.begin(), l.expert_in_slot.end(), -1);
  STRATA_CUDA_TRY(cudaMemcpy(l.slot_of, l.slot_of_host.data(), sizeof(int) * n_expert, cudaMemcpyHostToDevice));
  for (int m = 0; m < 3; ++m) {
    const void* dst[5] = {dev[m]->planes.codes, dev[m]->planes.d, dev[m]->planes.sub_scales, dev[m]->planes.mins,
                          dev[m]->planes.sub_mins};
    for (int i = 0; i < 5; ++i) {
      const std::size_t b = expert_plane_bytes(*host[m], i);
      if (b == 0) continue;
      const char* src = static_cast<const char*>(planes_of(*host[m], i)->data);
      char* to = static_cast<char*>(const_cast<void*>(dst[i]));
      // Runs of consecutive ids are one copy each: a layer held whole is one copy per plane.
      for (int s = 0, n = static_cast<int>(experts.size()), run; s < n; s += run) {
        for (run = 1; s + run < n && experts[s + run] == experts[s] + run;) ++run;
        STRATA_CUDA_TRY(cudaMemcpy(to + b * s, src + b * experts[s], b * run, cudaMemcpyHostToDevice));
      }
    }
  }
  STRATA_CUDA_TRY(cudaMemcpy(l.slot_of, slot_of.data(), sizeof(int) * n_expert, cudaMemcpyHostToDevice));
  l.slot_of_host = slot_of;
  l.expert_in_slot.assign(experts.begin(), experts.end());
  l.expert_in_slot.resize(slots, -1);
}

int ExpertCache::layers() const noexcept { return static_cast<int>(impl_->layers.size()); }
int ExpertCache::n_expert(int layer) const { return static_cast<int>(impl_->at(layer).slot_of_host.size()); }
int ExpertCache::slots(int layer) const { return impl_->at(layer).device.slots; }

bool ExpertCache::holds(int layer, int expert) const noexcept {
  if (layer < 0 || layer >= layers()) return false;
  const std::vector<int>& map = impl_->layers[layer].slot_of_host;
  return expert >= 0 && expert < static_cast<int>(map.size()) && map[expert] >= 0;
}

bool ExpertCache::holds_all(int layer) const noexcept {
  if (layer < 0 || layer >= layers()) return false;
  const std::vector<int>& map = impl_->layers[layer].slot_of_host;
  return !map.empty() && std::all_of(map.begin(), map.end(), [](int s) { return s >= 0; });
}

std::vector<int> ExpertCache::held(int layer) const { return impl_->at(layer).expert_in_slot; }
const CachedLayer& ExpertCache::layer(int index) const { return impl_->at(index).device; }
std::size_t ExpertCache::bytes() const noexcept { return impl_->bytes; }
int ExpertCache::device() const noexcept { return impl_->device; }

}  // namespace strata
