// The decode step's router and publish in one launch (docs/session.md, pre[l] step 5): the router GEMV's rows
// spread over many CTAs (the row dots of gemv_float and gemv_quant, so the logits are their bits), and the last
// CTA to finish runs moe_route's selection on them (the same device code), the chosen experts' slots in the
// VRAM cache, and doorbell_publish's payload, fence and ring; every CTA copies its share of x into
// the doorbell before taking its ticket. Launchers never allocate, synchronise or throw: capturable, and a
// graph replays the launch (the last CTA resets the ticket).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "doorbell.cuh"
#include "gemv.cuh"
#include "strata/forms.hpp"

namespace strata::kernels {

// The router [n_expert][cols] as the GEMVs read it.
struct RouterMatrix {
  WeightMatrix matrix;
  int n_expert = 0;
  int cols = 0;
};

// The router's input: x [cols] floats (read by float routers, copied to the doorbell) and, for a quantized
// router, q8_32(x) (quantize_q8_32: xq [cols], dx and sums [cols / 32]).
struct RouterInput {
  const float* x = nullptr;
  const std::int8_t* xq = nullptr;
  const float* dx = nullptr;
  const std::int32_t* sums = nullptr;
};

// Where the route goes (device memory). `ticket`: one word, zero before the first launch (the last CTA leaves
// it zero again). slot_of [n_expert] (null: no VRAM cache, slots untouched): slots[j] = slot_of[ids[j]].
struct RouteTargets {
  float* logits = nullptr;  // [n_expert]: the CTAs hand the rows to the last one here
  std::int32_t* ids = nullptr;
  float* weights = nullptr;
  const int* slot_of = nullptr;
  int* slots = nullptr;
  unsigned* ticket = nullptr;
};

// The publish: with `ring` false nothing reaches the doorbell (a layer whose experts the cache holds whole).
// bell.n == cols and bell.k == k.
struct RoutePublish {
  bool ring = false;
  Doorbell bell;
  const int* ring_base = nullptr;
  int ring_offset = 0;
};

// ids [k], weights [k] = moe_route of logits = W x (one token), slots as above, then with publish.ring:
// doorbell_publish(bell, x, ids, weights, ring_base, ring_offset). The shapes of moe_route (n_expert <=
// kRouterMaxExperts, 1 <= k <= min(n_expert, kRouterMaxTopK)) and the operands of gemv_float / gemv_quant;
// anything else -> cudaErrorInvalidValue (cudaErrorMisalignedAddress for misaligned quantized operands).
cudaError_t route_publish(const RouterMatrix& w, const RouterInput& x, int k, const RouteTargets& out,
                          const RoutePublish& publish, cudaStream_t stream);

}  // namespace strata::kernels
