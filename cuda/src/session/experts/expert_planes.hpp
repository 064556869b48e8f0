// The pool's routed expert planes as the GPU copies them: one expert's bytes of each plane, stacks of slots on
// the device in the pool's canonical forms, copies of runs of experts from host to device, and page-locking the
// host planes so those copies run asynchronously. Shared by the VRAM expert cache (slots that persist) and the
// prompt path's staging (slots refilled per chunk). Host-only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/device_weights.hpp"
#include "strata/expert_pool.hpp"

namespace strata {

// Gate, up and down of `slots` experts as device stacks (each DeviceTensor's rows are one matrix's rows).
struct ExpertStacks {
  DeviceTensor gate, up, down;
};

// One expert's bytes of plane i (codes, d, sub_scales, mins, sub_mins) of `m` (0: the form lacks the plane).
std::size_t expert_plane_bytes(const cpu::ExpertMatrix& m, int plane);

// Bytes of one expert of `layer`: every plane of gate, up and down.
std::size_t expert_bytes(const cpu::LayerMatrices& layer);

// Bytes of the stacks of `slots` experts of `layer`, each plane 256-byte aligned (what carve_stacks takes).
std::size_t stacks_bytes(const cpu::LayerMatrices& layer, int slots);

// The stacks of `slots` experts of `layer`'s forms, carved from `at` (stacks_bytes of them).
ExpertStacks carve_stacks(const cpu::LayerMatrices& layer, int slots, char* at);

// Enqueues the planes of experts first .. first + count - 1 of `layer` into `to`'s slots from `slot` on.
void copy_experts(const cpu::LayerMatrices& layer, const ExpertStacks& to, int slot, int first, int count,
                  cudaStream_t stream);

// Enqueues one expert's planes, packed as cpu::ExpertPool::read_expert hands them out (gate, up, then down; each
// plane its form has in the order codes, d, sub_scales, mins, sub_mins), into `to`'s slot `slot`. `layer` gives
// the forms and sizes (ExpertPool::layer_forms: a tiered layer has no planes to copy from).
void copy_packed_expert(const cpu::LayerMatrices& layer, const ExpertStacks& to, int slot, const std::uint8_t* packed,
                        cudaStream_t stream);

// Page-locks the pages wholly inside each plane of `layers` (never a page a plane shares with memory it does not
// own: the heap may unmap such a page and reuse the addresses under a registration) and returns the registered
// starts, for cudaHostUnregister. A copy's part outside them (an edge expert) is staged by the driver: slower,
// as correct; so is one from pages another owner locked first. `what` names the owner in the error.
std::vector<void*> pin_planes(const std::vector<cpu::LayerMatrices>& layers, const std::string& what);

}  // namespace strata
