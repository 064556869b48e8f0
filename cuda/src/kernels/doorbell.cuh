// The GPU side of the doorbell (architecture.md, "One decode token"): publish a layer's routing request into
// mapped pinned host memory and ring, and a device-side wait for the host's answer with a bounded spin.
// Ring numbers come from device memory (*ring_base, rewritten per token) plus a per-layer constant offset,
// so a captured graph rings a fresh number every replay. Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

// Ring numbers are 32-bit serial numbers: a session that lives long enough wraps them (48 layers at 100
// tokens/s pass 2^31 rings in 5 days: a server's sessions do), so they are added and compared modulo 2^32,
// by the sign of their difference, which is exact while the two are within 2^31 (they are a few layers apart).
__host__ __device__ inline int ring_at(int base, int offset) {
  return static_cast<int>(static_cast<unsigned>(base) + static_cast<unsigned>(offset));
}
__host__ __device__ inline bool ring_reached(int seen, int ring) {
  return static_cast<int>(static_cast<unsigned>(seen) - static_cast<unsigned>(ring)) >= 0;
}

// Device-mapped pointers (cudaHostGetDevicePointer) into pinned host memory.
// A doorbell of `rows` rows (a step of several rows publishes them all under one ring) holds each row's x, ids,
// weights and answer one after another.
struct Doorbell {
  float* x = nullptr;              // [rows][n] the routed experts' input rows
  int* ids = nullptr;              // [rows][k] expert ids
  float* weights = nullptr;        // [rows][k] routing weights
  int* seq = nullptr;              // GPU -> host: the last ring number published
  const int* flag = nullptr;       // host -> GPU: the last ring number answered
  const float* answer = nullptr;   // [rows][n] the host's answer rows
  int n = 0;
  int k = 0;
  int rows = 1;
  // host -> GPU: [2][n] the deferred rows (expert deferral, docs/session.md), one per layer parity; each is
  // written before the answer of the next layer's ring, whose flag orders it.
  const float* deferred = nullptr;
};

// Copies x, ids, weights (of `rows` rows, 1..bell.rows) into the doorbell, fences them system-wide, then writes
// seq = ring_at(*ring_base, ring_offset).
cudaError_t doorbell_publish(const Doorbell& bell, const float* x, const int* ids, const float* weights,
                             const int* ring_base, int ring_offset, cudaStream_t stream, int rows = 1);

// Spins until flag reaches ring_at(*ring_base, ring_offset), then copies the answer into `answer_out` [n]
// (device memory). After timeout_ns nanoseconds (the GPU's global timer) without an answer it writes
// ring_offset (> 0: a ring number may be 0 once wrapped) into *status and leaves answer_out as it was; *status
// is left untouched on success, so one zeroed status word can serve a whole token. With `deferred_out`, the
// answer also brings deferred row `deferred_row` (0 or 1) into it [n], under the same flag.
cudaError_t doorbell_wait(const Doorbell& bell, const int* ring_base, int ring_offset, long long timeout_ns,
                          int* status, float* answer_out, cudaStream_t stream, int deferred_row = -1,
                          float* deferred_out = nullptr);

// doorbell_wait for `rows` rows (1..bell.rows) of answer into answer_out [rows][n], a CTA a row, without deferred
// rows: a step of several rows' routed experts.
cudaError_t doorbell_wait_rows(const Doorbell& bell, const int* ring_base, int ring_offset, long long timeout_ns,
                               int* status, int rows, float* answer_out, cudaStream_t stream);

}  // namespace strata::kernels
