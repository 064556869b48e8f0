#include "expert_planes.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "strata/error.hpp"

namespace strata {
namespace {

const cpu::Plane* plane_of_matrix(const cpu::ExpertMatrix& m, int i) {
  const cpu::Plane* all[5] = {&m.codes, &m.d, &m.sub_scales, &m.mins, &m.sub_mins};
  return all[i];
}

// The pages wholly inside plane `p`: what pin_planes locks of it ([begin, end)).
std::pair<std::uintptr_t, std::uintptr_t> locked_pages(const cpu::Plane& p) {
  static const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto data = reinterpret_cast<std::uintptr_t>(p.data);
  return {(data + page - 1) / page * page, (data + p.nbytes) / page * page};
}

}  // namespace

std::size_t expert_plane_bytes(const cpu::ExpertMatrix& m, int plane) {
  return m.n_expert ? static_cast<std::size_t>(plane_of_matrix(m, plane)->nbytes / m.n_expert) : 0;
}

std::size_t expert_bytes(const cpu::LayerMatrices& layer) {
  std::size_t bytes = 0;
  for (const cpu::ExpertMatrix* m : {&layer.gate, &layer.up, &layer.down}) {
    for (int i = 0; i < 5; ++i) bytes += expert_plane_bytes(*m, i);
  }
  return bytes;
}

std::size_t stacks_bytes(const cpu::LayerMatrices& layer, int slots) {
  std::size_t bytes = 0;
  for (const cpu::ExpertMatrix* m : {&layer.gate, &layer.up, &layer.down}) {
    for (int i = 0; i < 5; ++i) {
      if (const std::size_t b = expert_plane_bytes(*m, i)) bytes += plane_aligned(b * slots);
    }
  }
  return bytes;
}

ExpertStacks carve_stacks(const cpu::LayerMatrices& layer, int slots, char* at) {
  ExpertStacks stacks;
  const cpu::ExpertMatrix* host[3] = {&layer.gate, &layer.up, &layer.down};
  DeviceTensor* dev[3] = {&stacks.gate, &stacks.up, &stacks.down};
  for (int m = 0; m < 3; ++m) {
    const void* placed[5] = {};
    for (int i = 0; i < 5; ++i) {
      if (const std::size_t b = expert_plane_bytes(*host[m], i)) {
        placed[i] = at;
        at += plane_aligned(b * slots);
      }
    }
    *dev[m] = placed_tensor(host[m]->is_float, host[m]->float_kind, host[m]->form, host[m]->rows, host[m]->cols,
                            placed);
  }
  return stacks;
}

namespace {

// f(host plane, its bytes per expert, its slot `slot` on the device) for every plane of gate, up and down that the
// forms have, in the order codes, d, sub_scales, mins, sub_mins: the order read_expert packs an expert in.
template <class F>
void for_each_plane(const cpu::LayerMatrices& layer, const ExpertStacks& to, int slot, F&& f) {
  const cpu::ExpertMatrix* host[3] = {&layer.gate, &layer.up, &layer.down};
  const DeviceTensor* dev[3] = {&to.gate, &to.up, &to.down};
  for (int m = 0; m < 3; ++m) {
    for (int i = 0; i < 5; ++i) {
      const std::size_t b = expert_plane_bytes(*host[m], i);
      if (b == 0) continue;
      f(*plane_of_matrix(*host[m], i), b, static_cast<char*>(const_cast<void*>(plane_of(*dev[m], i))) + b * slot);
    }
  }
}

}  // namespace

void copy_experts(const cpu::LayerMatrices& layer, const ExpertStacks& to, int slot, int first, int count,
                  cudaStream_t stream) {
  for_each_plane(layer, to, slot, [&](const cpu::Plane& plane, std::size_t b, char* dst) {
    const auto from = reinterpret_cast<std::uintptr_t>(plane.data) + b * first, end = from + b * count;
    // A copy may not straddle locked and unlocked pages (the runtime refuses it): cut at the locked
    // interior's edges, so that each piece is all one or the other.
    const auto [lo, hi] = locked_pages(plane);
    const std::uintptr_t cuts[4] = {from, std::clamp(lo, from, end), std::clamp(std::max(lo, hi), from, end), end};
    for (int piece = 0; piece < 3; ++piece) {
      if (cuts[piece + 1] == cuts[piece]) continue;
      STRATA_CUDA_TRY(cudaMemcpyAsync(dst + (cuts[piece] - from), reinterpret_cast<const void*>(cuts[piece]),
                                      cuts[piece + 1] - cuts[piece], cudaMemcpyHostToDevice, stream));
    }
  });
}

void copy_packed_expert(const cpu::LayerMatrices& layer, const ExpertStacks& to, int slot, const std::uint8_t* packed,
                        cudaStream_t stream) {
  for_each_plane(layer, to, slot, [&](const cpu::Plane&, std::size_t b, char* dst) {
    STRATA_CUDA_TRY(cudaMemcpyAsync(dst, packed, b, cudaMemcpyHostToDevice, stream));
    packed += b;
  });
}

std::vector<void*> pin_planes(const std::vector<cpu::LayerMatrices>& layers, const std::string& what) {
  std::vector<void*> pinned;
  try {
    for (const cpu::LayerMatrices& layer : layers) {
      for (const cpu::ExpertMatrix* matrix : {&layer.gate, &layer.up, &layer.down}) {
        for (int i = 0; i < 5; ++i) {
          const cpu::Plane* p = plane_of_matrix(*matrix, i);
          const auto [begin, end] = locked_pages(*p);
          if (p->nbytes == 0 || end <= begin) continue;
          void* at = reinterpret_cast<void*>(begin);
          const cudaError_t e = cudaHostRegister(at, end - begin, cudaHostRegisterDefault);
          if (e == cudaErrorHostMemoryAlreadyRegistered) {  // another owner of the same pool locked it
            (void)cudaGetLastError();
            continue;
          }
          STRATA_EXPECTS(e == cudaSuccess, Error,
                         what + ": page-locking " + std::to_string(end - begin) + " bytes of routed expert weights "
                             "failed (" + cudaGetErrorString(e) + "); raise the locked-memory limit (ulimit -l)");
          pinned.push_back(at);
        }
      }
    }
  } catch (...) {
    for (void* p : pinned) (void)cudaHostUnregister(p);
    throw;
  }
  return pinned;
}

}  // namespace strata
