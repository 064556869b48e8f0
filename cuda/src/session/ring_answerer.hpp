// The host loop's one job per MoE layer: wait for the GPU's ring, compute the routed experts on the CPU
// pool, hand the combined row back. Allocates once, at construction.
#pragma once

#include <chrono>
#include <vector>

#include "doorbell_host.hpp"
#include "strata/expert_pool.hpp"

namespace strata {

struct ExchangeStats {
  double ring_wait_seconds = 0.0;  // host spinning for the GPU's ring (GPU work before the router)
  double pool_seconds = 0.0;       // the pool computing the routed experts and the combine
  long rings = 0;
};

class RingAnswerer {
 public:
  RingAnswerer(cpu::ExpertPool& pool, DoorbellHost& bell);

  // Waits for `ring` from MoE layer `layer`, answers it with sum_j weights[j] * expert_ids[j](x).
  // Throws strata::Error naming the layer when the GPU does not ring within `timeout`.
  void answer(int layer, int ring, std::chrono::nanoseconds timeout, ExchangeStats& stats);

 private:
  cpu::ExpertPool& pool_;
  DoorbellHost& bell_;
  std::vector<float> rows_;  // [k][n]: the pool's weighted expert rows
};

}  // namespace strata
