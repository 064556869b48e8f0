// kernel_check round trips of the plumbing kernels: embedding row gather and the doorbell (with a real host
// thread answering through mapped pinned memory).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "../kernels/doorbell.cuh"
#include "../kernels/embed.cuh"
#include "../runtime/pinned_memory.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_mixers.hpp"

namespace strata::kernel_check {
namespace {

using support::GuardedOutput;
using support::upload;

constexpr auto kHostWait = std::chrono::seconds(10);

}  // namespace

void embed_rows(int device, int kind, int rows, int cols, const void* data, const std::uint16_t* d, const int* ids,
                int n_ids, float* out) {
  STRATA_EXPECTS(kind >= 0 && kind <= 3, InvalidArgument,
                 "embed_rows: kind " + std::to_string(kind) + " is not one of 0 F32, 1 F16, 2 BF16, 3 Q8_0");
  STRATA_EXPECTS(rows > 0 && cols > 0 && n_ids > 0 && (kind != 3 || cols % 32 == 0), InvalidArgument,
                 "embed_rows: need rows, cols, n_ids > 0 (and cols % 32 == 0 for Q8_0), got " + std::to_string(rows) +
                     " x " + std::to_string(cols) + ", " + std::to_string(n_ids) + " ids");
  support::check_device(device);
  DeviceScope scope(device);
  const std::size_t element = kind == 0 ? 4 : kind == 3 ? 1 : 2;
  const std::size_t cells = static_cast<std::size_t>(rows) * cols;
  DeviceBuffer d_data = upload(data, cells * element);
  DeviceBuffer d_scales = kind == 3 ? upload(d, cells / 32 * sizeof(std::uint16_t)) : DeviceBuffer(0);
  DeviceBuffer d_ids = upload(ids, n_ids * sizeof(int));
  GuardedOutput d_out(static_cast<std::size_t>(n_ids) * cols * sizeof(float));
  kernels::EmbedTable table{static_cast<kernels::EmbedKind>(kind), rows, cols, d_data.as<void>(),
                            d_scales.as<__half>()};
  STRATA_CUDA_TRY(kernels::embed_rows(table, d_ids.as<int>(), n_ids, d_out.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "embed_rows");
}

DoorbellCheckResult doorbell_round_trip(int device, int n, int k, const float* x, const int* ids,
                                        const float* weights, int ring_base, int ring_offset, bool answer,
                                        const float* answer_row, long long timeout_ns, float* published_x,
                                        int* published_ids, float* published_weights, float* answered) {
  STRATA_EXPECTS(n > 0 && k >= 0 && timeout_ns > 0 && ring_base + ring_offset > 0, InvalidArgument,
                 "doorbell_round_trip: need n > 0, k >= 0, timeout_ns > 0 and a positive ring number, got n=" +
                     std::to_string(n) + " k=" + std::to_string(k) + " ring=" + std::to_string(ring_base + ring_offset));
  support::check_device(device);
  DeviceScope scope(device);
  PinnedMapped bell_x(n * sizeof(float)), bell_ids(k * sizeof(int) + 4), bell_weights(k * sizeof(float) + 4),
      bell_seq(sizeof(int)), bell_flag(sizeof(int)), bell_answer(n * sizeof(float));
  DeviceBuffer d_x = upload(x, n * sizeof(float)), d_ids = upload(ids, k * sizeof(int)),
               d_weights = upload(weights, k * sizeof(float)), d_base = upload(&ring_base, sizeof(int));
  GuardedOutput d_status(sizeof(int)), d_answered(n * sizeof(float));
  STRATA_CUDA_TRY(cudaMemset(d_status.data<int>(), 0, sizeof(int)));
  kernels::Doorbell bell{bell_x.device<float>(), bell_ids.device<int>(), bell_weights.device<float>(),
                         bell_seq.device<int>(), bell_flag.device<int>(), bell_answer.device<float>(), n, k};

  // The host side, as the pool's loop will run it: spin on seq, read the request, write the answer, fence, flag.
  const int expected = ring_base + ring_offset;
  std::atomic<int> seen{0};
  std::thread host([&] {
    const auto* seq = reinterpret_cast<const volatile int*>(bell_seq.host<int>());
    const auto deadline = std::chrono::steady_clock::now() + kHostWait;
    while (*seq < expected && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    if (*seq < expected) return;
    std::atomic_thread_fence(std::memory_order_acquire);
    seen = *seq;
    std::memcpy(published_x, bell_x.host<float>(), n * sizeof(float));
    std::memcpy(published_ids, bell_ids.host<int>(), k * sizeof(int));
    std::memcpy(published_weights, bell_weights.host<float>(), k * sizeof(float));
    if (!answer) return;
    std::memcpy(bell_answer.host<float>(), answer_row, n * sizeof(float));
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *reinterpret_cast<volatile int*>(bell_flag.host<int>()) = expected;
  });
  cudaStream_t stream = nullptr;
  cudaError_t launched = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (launched == cudaSuccess) {
    launched = kernels::doorbell_publish(bell, d_x.as<float>(), d_ids.as<int>(), d_weights.as<float>(),
                                         d_base.as<int>(), ring_offset, stream);
    if (launched == cudaSuccess)
      launched = kernels::doorbell_wait(bell, d_base.as<int>(), ring_offset, timeout_ns, d_status.data<int>(),
                                        d_answered.data<float>(), stream);
    if (launched == cudaSuccess) launched = cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  host.join();  // never leave the thread running past the mapped buffers it reads
  STRATA_CUDA_TRY(launched);
  DoorbellCheckResult result;
  result.seq_seen = seen;
  d_status.copy_out(&result.status, "doorbell_wait (status)");
  d_answered.copy_out(answered, "doorbell_wait");
  return result;
}

}  // namespace strata::kernel_check
