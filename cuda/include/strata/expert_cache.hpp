// Routed experts held in VRAM (docs/expert_cache.md): per MoE layer a number of slots, each holding one
// expert's gate, up and down in the same canonical form, the same bytes, the CPU pool streams, and the map
// expert -> slot the decode program reads on the device and the host loop reads here. A layer whose every
// expert is held runs on the GPU alone and never rings the doorbell. With replacement (expert_policy.hpp) the
// host loop reports each token's routing, and between tokens the cache copies admitted experts from pinned
// host memory on a stream of its own, beside the next token, into slots no token reads while they fill.
// Host-only header.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "strata/device_weights.hpp"
#include "strata/expert_policy.hpp"

struct CUstream_st;

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
  // With policy.replace, the pool's planes of every partly cached layer are pinned (page-locked) until the
  // cache is destroyed, so that copies run beside the tokens. A tiered layer (docs/tiers.md: part of its experts in
  // the pool's arena, the rest in the file) is held static: hold() reads its experts through the pool
  // (read_expert), and policy.replace with such a layer partly cached is refused. The pool outlives the cache.
  ExpertCache(int device, cpu::ExpertPool& pool, const std::vector<int>& slots, const PolicyOptions& policy = {});
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Copies `experts` (distinct ids of layer `layer`, at most its slots) from the pool's host weights (a tiered
  // layer's: its arena, or the file) into the layer's slots in order; slots after them hold nothing. Blocking; no
  // session of the model may be stepping.
  void hold(int layer, const std::vector<int>& experts);

  // The host loop's report of one token's routed ids in `layer` (a layer that rings): replacement learns from it.
  void note_routed(int layer, const std::int32_t* ids, int k);

  // Between two tokens of any session of the model (none running): the copies begun before the previous
  // token enter the map, the policy's new ones begin (their slots leave the map), and the changed maps are
  // enqueued on `token_stream` ahead of the next token. Returns the copies begun.
  std::vector<ExpertMove> between_tokens(CUstream_st* token_stream);

  // Bytes of one expert of `layer` (gate, up and down, every plane).
  std::size_t expert_bytes(int layer) const;

  int layers() const noexcept;
  int n_expert(int layer) const;
  int slots(int layer) const;
  bool holds(int layer, int expert) const noexcept;  // the host's copy of slot_of, as the device has it
  bool holds_all(int layer) const noexcept;          // every expert of the layer is held
  int slot_of(int layer, int expert) const noexcept; // the slot holding `expert` as the device map has it, or -1
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
