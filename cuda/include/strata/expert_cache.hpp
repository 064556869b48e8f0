// Routed experts held in VRAM (docs/expert_cache.md): per MoE layer a number of slots, each holding one
// expert's gate, up and down in the same canonical form, the same bytes, the CPU pool streams, and the map
// expert -> slot the decode program reads on the device and the host loop reads here. A layer whose every
// expert is held runs on the GPU alone and never rings the doorbell. Host-only header.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "strata/device_weights.hpp"

namespace strata {

namespace cpu {
class ExpertPool;
}

// One layer's slots on the device: gate and up (expert_ff x n_embd) and down (n_embd x expert_ff) as stacks of
// `slots` matrices (each DeviceTensor's rows are one matrix's rows), and slot_of [n_expert] (-1: not held).
struct CachedLayer {
  int slots = 0;
  DeviceTensor gate, up, down;
  const int* slot_of = nullptr;
};

class ExpertCache {
 public:
  // Room on `device` for slots[l] experts of every layer l the pool has registered (0 .. its n_expert), all
  // empty until hold() fills them. OutOfMemory names the bytes; InvalidArgument the layer whose count is off.
  ExpertCache(int device, const cpu::ExpertPool& pool, const std::vector<int>& slots);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Copies `experts` (distinct ids of layer `layer`, at most its slots) from the pool's host weights into the
  // layer's slots in order; slots after them hold nothing. Blocking; no session of the model may be stepping.
  void hold(int layer, const std::vector<int>& experts);

  int layers() const noexcept;
  int n_expert(int layer) const;
  int slots(int layer) const;
  bool holds(int layer, int expert) const noexcept;  // the host's copy of slot_of, as the device has it
  bool holds_all(int layer) const noexcept;          // every expert of the layer is held
  std::vector<int> held(int layer) const;            // the expert in each slot, -1 for an empty one
  const CachedLayer& layer(int index) const;
  std::size_t bytes() const noexcept;                // the one allocation, every plane and map included
  int device() const noexcept;

  // Bytes the cache of `slots` would allocate for the pool's layers (what the constructor allocates).
  static std::size_t bytes_for(const cpu::ExpertPool& pool, const std::vector<int>& slots);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
