// The prompt path's staging for routed experts (docs/prompt.md): two VRAM buffers of `slots` experts each, in
// the pool's canonical forms, refilled per chunk and layer from the pool's page-locked host planes on a copy
// stream of their own, so that one buffer fills over PCIe while the other is computed from. The pool's planes
// of every MoE layer stay page-locked while the staging lives. Host-only header.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "strata/expert_cache.hpp"

struct CUstream_st;

namespace strata {

namespace cpu {
class ExpertPool;
}

class ExpertStaging {
 public:
  static constexpr int kBuffers = 2;

  // Room on `device` for kBuffers x `slots` experts of the pool's largest layer; OutOfMemory names the bytes,
  // InvalidArgument a slot count outside 1..n_expert or a pool without layers. Times one fill (copy_rate).
  ExpertStaging(int device, const cpu::ExpertPool& pool, int slots);
  ~ExpertStaging();
  ExpertStaging(const ExpertStaging&) = delete;
  ExpertStaging& operator=(const ExpertStaging&) = delete;

  // Enqueues the copies of `experts` (distinct ids of `layer`, at most slots()) into buffer `buffer`'s slots in
  // order, on the staging's stream, after the work that last released the buffer. Returns the buffer's stacks
  // in the layer's forms (slot_of is null: the caller maps the slots), valid until the buffer's next fill.
  const CachedLayer& fill(int buffer, int layer, const std::vector<int>& experts);

  // The stacks of buffer `buffer` as its last fill placed them.
  const CachedLayer& stacks(int buffer) const;

  // Makes `compute` wait for the buffer's last fill: enqueued right before the work that reads it.
  void await(int buffer, CUstream_st* compute);

  // The work enqueued on `compute` so far is the last to read buffer `buffer` until its next fill.
  void release(int buffer, CUstream_st* compute);

  // Bytes of one expert of `layer` (every plane of gate, up and down).
  std::size_t expert_bytes(int layer) const;

  // Bytes per second of a whole layer's fill, timed once at construction: the PCIe rate a chunk's copies get.
  double copy_rate() const noexcept;

  int slots() const noexcept;
  int n_expert() const noexcept;
  std::size_t bytes() const noexcept;  // the one allocation
  int device() const noexcept;

  // Bytes a staging of `slots` would allocate for the pool (what the constructor allocates).
  static std::size_t bytes_for(const cpu::ExpertPool& pool, int slots);

  struct Impl;

 private:
  void time_copies();
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
