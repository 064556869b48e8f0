#include "doorbell.cuh"
#include "doorbell_ring.cuh"
#include "host_poll.cuh"
#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kDoorbellThreads = 256;

__global__ void doorbell_publish_kernel(Doorbell bell, const float* __restrict__ x, const int* __restrict__ ids,
                                        const float* __restrict__ weights, const int* __restrict__ ring_base,
                                        int ring_offset, int rows) {
  await_producers();
  release_consumers();
  publish_x(bell, x, rows * bell.n, threadIdx.x, blockDim.x);
  for (int i = threadIdx.x; i < rows * bell.k; i += blockDim.x) {
    bell.ids[i] = ids[i];
    bell.weights[i] = weights[i];
  }
  __threadfence_system();  // each thread's payload writes reach the host before the ring below
  __syncthreads();
  if (threadIdx.x == 0) ring_doorbell(bell, ring_base, ring_offset);
}

__global__ void doorbell_wait_kernel(Doorbell bell, const int* __restrict__ ring_base, int ring_offset,
                                     long long timeout_ns, int* status, float* __restrict__ answer_out,
                                     const float* deferred_in, float* __restrict__ deferred_out) {
  await_producers();
  release_consumers();
  // CTA r copies answer row r (one CTA: a decode token's row): each CTA sees the flag for itself before it reads.
  const long row = static_cast<long>(blockIdx.x) * bell.n;
  __shared__ int answered;
  if (threadIdx.x == 0) {
    const int expected = ring_at(*ring_base, ring_offset);
    const volatile int* flag = bell.flag;
    answered = poll_until([&] { return ring_reached(*flag, expected); }, timeout_ns);
    if (!answered) *status = ring_offset;
    __threadfence_system();  // acquire: the answer is read only after the flag was seen
  }
  __syncthreads();
  if (!answered) return;
  const volatile float* answer = bell.answer + row;
  for (int i = threadIdx.x; i < bell.n; i += blockDim.x) answer_out[row + i] = answer[i];
  if (!deferred_out) return;
  const volatile float* deferred = deferred_in;
  for (int i = threadIdx.x; i < bell.n; i += blockDim.x) deferred_out[i] = deferred[i];
}

}  // namespace

cudaError_t doorbell_publish(const Doorbell& bell, const float* x, const int* ids, const float* weights,
                             const int* ring_base, int ring_offset, cudaStream_t stream, int rows) {
  if (bell.n <= 0 || bell.k < 0 || bell.x == nullptr || bell.seq == nullptr || rows < 1 || rows > bell.rows) {
    return cudaErrorInvalidValue;
  }
  return launch(doorbell_publish_kernel, 1, kDoorbellThreads, 0, stream, bell, x, ids, weights, ring_base, ring_offset,
                rows);
}

cudaError_t doorbell_wait(const Doorbell& bell, const int* ring_base, int ring_offset, long long timeout_ns,
                          int* status, float* answer_out, cudaStream_t stream, int deferred_row,
                          float* deferred_out) {
  if (bell.n <= 0 || bell.flag == nullptr || bell.answer == nullptr || timeout_ns <= 0) return cudaErrorInvalidValue;
  if (deferred_out && (bell.deferred == nullptr || (deferred_row != 0 && deferred_row != 1))) {
    return cudaErrorInvalidValue;
  }
  const float* deferred_in = deferred_out ? bell.deferred + static_cast<long>(deferred_row) * bell.n : nullptr;
  return launch(doorbell_wait_kernel, 1, kDoorbellThreads, 0, stream, bell, ring_base, ring_offset, timeout_ns, status,
                answer_out, deferred_in, deferred_out);
}

cudaError_t doorbell_wait_rows(const Doorbell& bell, const int* ring_base, int ring_offset, long long timeout_ns,
                               int* status, int rows, float* answer_out, cudaStream_t stream) {
  if (bell.n <= 0 || bell.flag == nullptr || bell.answer == nullptr || timeout_ns <= 0 || rows < 1 ||
      rows > bell.rows) {
    return cudaErrorInvalidValue;
  }
  return launch(doorbell_wait_kernel, rows, kDoorbellThreads, 0, stream, bell, ring_base, ring_offset, timeout_ns,
                status, answer_out, nullptr, nullptr);
}

}  // namespace strata::kernels
