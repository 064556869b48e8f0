// The host loop's one job per MoE layer: wait for the GPU's ring, compute the routed experts the VRAM cache
// does not hold on the CPU pool, hand their combined row back (the GPU adds the cached ones); with expert
// deferral, the deferred ones after the answer, into their own row. Allocates once, at construction.
#pragma once

#include <chrono>
#include <vector>

#include "doorbell_host.hpp"
#include "expert_deferral.hpp"
#include "strata/expert_cache.hpp"
#include "strata/expert_pool.hpp"

namespace strata {

struct ExchangeStats {
  double ring_wait_seconds = 0.0;  // host spinning for the GPU's ring (GPU work before the router)
  double pool_seconds = 0.0;       // the pool computing the routed experts and the combine
  long rings = 0;
  std::vector<long> hits, misses;  // per layer: routed experts the cache held, and the pool computed
};

class RingAnswerer {
 public:
  // `cache` may be null (the pool computes every routed expert); it must outlive the answerer.
  RingAnswerer(cpu::ExpertPool& pool, DoorbellHost& bell, ExpertCache* cache = nullptr,
               ExpertDeferral deferral = {});

  // Waits for `ring` from MoE layer `layer`, answers it with sum_j weights[j] * expert_ids[j](x) over the j
  // the cache does not hold (and, where the layer defers, the pool does not defer), and tells the cache the
  // routing; a layer the cache holds whole never rings and is only counted. Layer - 1's deferred experts are
  // computed first, into their row, while the GPU works towards this ring.
  // Throws strata::Error naming the layer when the GPU does not ring within `timeout`.
  void answer(int layer, int ring, std::chrono::nanoseconds timeout, ExchangeStats& stats);

  // A step of several rows: waits for `ring` from MoE layer `layer`, whose `rows` rows (at most the doorbell's)
  // the GPU published under it, and answers each row with answer()'s sum for it, the union of the rows' experts
  // computed once each (ExpertPool::run_rows_sum). Such a step rings every MoE layer, a layer the cache holds
  // whole included (its answer: zeros), so that a captured step stays right as the cache fills. Throws as answer().
  void answer_rows(int layer, int ring, int rows, std::chrono::nanoseconds timeout, ExchangeStats& stats);

 private:
  using Clock = std::chrono::steady_clock;
  void answer_deferred(ExchangeStats& stats);
  // Waits for `ring` from layer `layer`; returns when it was rung.
  void await_ring(int layer, int ring, std::chrono::nanoseconds timeout) const;
  // Once the ring is in: held_ marks which of the `rows` rows' routed slots the cache holds, the cache is told
  // each row's routing, and the hits and misses are counted.
  void note_routing(int layer, const std::int32_t* ids, int rows, ExchangeStats& stats);
  // Hands the answer to `ring` to the GPU and counts the ring's wait (start -> rung) and the pool's time.
  void answered(int ring, Clock::time_point start, Clock::time_point rung, ExchangeStats& stats);

  cpu::ExpertPool& pool_;
  DoorbellHost& bell_;
  ExpertCache* cache_;  // told each token's routing (its replacement learns from it)
  ExpertDeferral deferral_;
  std::vector<std::uint8_t> held_;   // [rows][k]: the cache holds routed slot j of row r (answer(): row 0 alone)
  std::vector<std::uint8_t> now_;    // [k]: the answer skips slot j (held or deferred)
  std::vector<std::uint8_t> later_;  // [k]: the deferred row skips slot j (all but the deferred)
  // The layer whose deferred experts are due (-1: none) with its request: once it is answered the GPU may
  // publish the next layer's into the doorbell, so the deferred experts read this copy.
  int deferred_layer_ = -1;
  std::vector<float> deferred_x_, deferred_weights_;
  std::vector<std::int32_t> deferred_ids_;
};

}  // namespace strata
