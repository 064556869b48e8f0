// The GPU's half of a publish, shared by doorbell_publish (doorbell.cu) and the router's fused launch
// (router_publish.cu): every thread that wrote part of the payload fences it system-wide before the one thread
// that rings writes seq, so the host never reads a request older than its ring number.
#pragma once

#include "doorbell.cuh"

namespace strata::kernels {

// Thread `first` of `step` threads copies its share of x [count] (bell.n a row) into the doorbell.
__device__ __forceinline__ void publish_x(const Doorbell& bell, const float* __restrict__ x, int count, int first,
                                          int step) {
  for (int i = first; i < count; i += step) bell.x[i] = x[i];
}

// seq = ring_at(*ring_base, ring_offset); after the payload writers' __threadfence_system().
__device__ __forceinline__ void ring_doorbell(const Doorbell& bell, const int* ring_base, int ring_offset) {
  *static_cast<volatile int*>(bell.seq) = ring_at(*ring_base, ring_offset);
}

}  // namespace strata::kernels
