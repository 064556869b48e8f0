// The host side of the doorbell: one block of mapped pinned memory holding what the GPU publishes for a
// MoE layer (x, ids, weights, then the ring number `seq`), what the host answers (the combined expert row,
// then `flag`; with expert deferral also a layer's deferred row, one per layer parity), and the per-token
// staging the captured graphs read (the ring base, the wait status).
#pragma once

#include <chrono>
#include <cstdint>

#include "../../kernels/doorbell.cuh"
#include "../../runtime/pinned_memory.hpp"

namespace strata {

// How long the host loop waits for a ring when the GPU's wait for an answer is `answer_timeout_seconds`:
// three times as long, so that when an answer goes missing the GPU's wait gives up first and the next ring
// still arrives in time; the error then names the layer whose answer was missing, not the one after it.
std::chrono::nanoseconds host_ring_timeout(double answer_timeout_seconds);

// How long a device-side wait for the host's answer lasts (the GPU's global timer, nanoseconds): the session's
// answer timeout, for the decode token's doorbell and a step's alike.
inline long long device_answer_timeout_ns(double answer_timeout_seconds) noexcept {
  return static_cast<long long>(answer_timeout_seconds * 1e9);
}

// The ring base of the `token`-th token a session runs (its rings are ring_at(base, 1 + layer)), modulo 2^32.
inline int ring_base_of(std::uint64_t token, int n_layer) noexcept {
  return static_cast<int>(static_cast<std::uint32_t>(token * static_cast<std::uint64_t>(n_layer)));
}

class DoorbellHost {
 public:
  // `first_ring_base`: the ring base of the first token this doorbell serves (ring_base_of its index). `rows`: the
  // most rows one ring publishes (a step of several rows; 1: a decode token), each with its x, ids, weights and
  // answer.
  DoorbellHost(int n, int k, int first_ring_base = 0, int rows = 1);

  // Pointers for the device kernels (all into the mapped block).
  kernels::Doorbell device_view() const noexcept;
  const int* ring_base_device() const noexcept { return memory_.device<int>(kRingBase); }
  int* status_device() const noexcept { return memory_.device<int>(kStatus); }

  // Per-token staging, rewritten before each launch or replay: rings of this token are ring_at(base, 1 + layer).
  void begin_token(int ring_base) noexcept;

  // Spins (with _mm_pause) until the GPU has rung `ring`; false once `timeout` has passed without it.
  bool wait_for_ring(int ring, std::chrono::nanoseconds timeout) const noexcept;
  int last_ring() const noexcept;

  // Row 0's; row r's follow at r * n (x, answer) and r * k (ids, weights).
  const float* x() const noexcept { return memory_.host<const float>(x_offset_); }
  const std::int32_t* ids() const noexcept { return memory_.host<const std::int32_t>(kIds); }
  const float* weights() const noexcept { return memory_.host<const float>(weights_offset_); }
  float* answer() const noexcept { return memory_.host<float>(answer_offset_); }
  // Layer l's deferred row is deferred(l % 2): the GPU reads it after the answer to ring l + 1, so the host
  // may write the next one, l + 1's, while that is pending.
  float* deferred(int parity) const noexcept {
    return memory_.host<float>(deferred_offset_) + static_cast<std::size_t>(parity) * n_;
  }

  // Publishes answer() to the GPU: everything written before this call is visible before `flag` moves.
  void answer_ready(int ring) noexcept;

  // 1 + the layer whose answer a device-side wait gave up on during this token, or 0.
  int timed_out_offset() const noexcept;

  // After a token whose rings are ring_at(ring_base, 1 + layer): throws Error naming the layer whose answer the
  // device-side wait (of `answer_timeout_seconds`) gave up on; returns when every answer arrived.
  void check_answers(int ring_base, double answer_timeout_seconds) const;

  int n() const noexcept { return n_; }
  int k() const noexcept { return k_; }
  int rows() const noexcept { return rows_; }

 private:
  // Each word the two sides hand over sits on its own cache line.
  static constexpr std::size_t kSeq = 0, kFlag = 64, kRingBase = 128, kStatus = 192, kIds = 256;

  int n_, k_, rows_;
  std::size_t weights_offset_, x_offset_, answer_offset_, deferred_offset_;
  PinnedMapped memory_;
};

}  // namespace strata
