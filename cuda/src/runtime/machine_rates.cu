#include "strata/machine_rates.hpp"

#include <cuda_runtime.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "../kernels/launch.cuh"
#include "device_buffer.hpp"
#include "pinned_memory.hpp"
#include "stream.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// The ping-pong's two words, each on its own cache line of the mapped block.
constexpr std::size_t kSeq = 0, kFlag = 64, kBlockBytes = 128;
constexpr int kWarmupRounds = 16;  // the kernel's start and the first PCIe round trips are not counted
constexpr long long kRingTimeoutNs = 1'000'000'000;
// The host waits twice as long as the kernel, so a missing answer ends the kernel before the host gives up.
constexpr auto kHostTimeout = std::chrono::seconds(2);

// Rings 1..rounds: publishes each ring number, then spins until the host has written it back; gives up (and
// rings no more) after kRingTimeoutNs of the GPU's global timer without the answer.
__global__ void ping_pong_kernel(int* seq, const int* flag, int rounds) {
  kernels::await_producers();
  kernels::release_consumers();
  volatile int* ring = seq;
  const volatile int* answer = flag;
  for (int i = 1; i <= rounds; ++i) {
    *ring = i;
    __threadfence_system();
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > static_cast<unsigned long long>(kRingTimeoutNs)) return;
    } while (*answer != i);
  }
}

void check_sizes(std::int64_t bytes, int reps, const std::string& what) {
  STRATA_EXPECTS(bytes >= 1, InvalidArgument, what + ": bytes must be >= 1, got " + std::to_string(bytes));
  STRATA_EXPECTS(reps >= 1, InvalidArgument, what + ": reps must be >= 1, got " + std::to_string(reps));
}

// Best seconds of `reps` cudaMemcpyAsync(dst, src, bytes) on one stream, timed by CUDA events, after one untimed.
double best_copy_seconds(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, int reps) {
  Stream stream;
  cudaEvent_t begin, end;
  STRATA_CUDA_TRY(cudaEventCreate(&begin));
  const cudaError_t created = cudaEventCreate(&end);
  if (created != cudaSuccess) {
    (void)cudaEventDestroy(begin);
    STRATA_CUDA_TRY(created);
  }
  float best_ms = 0.0f;
  cudaError_t status = cudaMemcpyAsync(dst, src, bytes, kind, stream.get());
  for (int r = 0; r < reps && status == cudaSuccess; ++r) {
    float ms = 0.0f;
    if ((status = cudaEventRecord(begin, stream.get())) != cudaSuccess) break;
    if ((status = cudaMemcpyAsync(dst, src, bytes, kind, stream.get())) != cudaSuccess) break;
    if ((status = cudaEventRecord(end, stream.get())) != cudaSuccess) break;
    if ((status = cudaEventSynchronize(end)) != cudaSuccess) break;
    if ((status = cudaEventElapsedTime(&ms, begin, end)) != cudaSuccess) break;
    if (r == 0 || ms < best_ms) best_ms = ms;
  }
  (void)cudaEventDestroy(begin);
  (void)cudaEventDestroy(end);
  STRATA_CUDA_TRY(status);
  STRATA_EXPECTS(best_ms > 0.0f, Error, "copy of " + std::to_string(bytes) + " bytes timed at 0 ms");
  return best_ms * 1e-3;
}

}  // namespace

double pinned_upload_rate(int device, std::int64_t bytes, int reps) {
  check_sizes(bytes, reps, "pinned_upload_rate");
  require_device(device);
  DeviceScope scope(device);
  const auto n = static_cast<std::size_t>(bytes);
  PinnedMapped host(n);  // page-locked (and zeroed, so every page is touched before the timing)
  DeviceBuffer target(n);
  return bytes / best_copy_seconds(target.as<void>(), host.host<void>(), n, cudaMemcpyHostToDevice, reps);
}

double device_copy_rate(int device, std::int64_t bytes, int reps) {
  check_sizes(bytes, reps, "device_copy_rate");
  require_device(device);
  DeviceScope scope(device);
  const auto n = static_cast<std::size_t>(bytes);
  DeviceBuffer source(n), target(n);
  STRATA_CUDA_TRY(cudaMemset(source.as<void>(), 0, n));
  return 2.0 * bytes / best_copy_seconds(target.as<void>(), source.as<void>(), n, cudaMemcpyDeviceToDevice, reps);
}

double doorbell_round_trip(int device, int rounds) {
  STRATA_EXPECTS(rounds >= 1, InvalidArgument,
                 "doorbell_round_trip: rounds must be >= 1, got " + std::to_string(rounds));
  require_device(device);
  DeviceScope scope(device);
  PinnedMapped block(kBlockBytes);
  volatile int* seq = block.host<int>(kSeq);
  volatile int* flag = block.host<int>(kFlag);
  const int total = kWarmupRounds + rounds + 1;  // seeing ring i + 1 closes round trip i
  Stream stream;
  STRATA_CUDA_TRY(kernels::launch(ping_pong_kernel, 1, 1, 0, stream.get(), block.device<int>(kSeq),
                                  block.device<const int>(kFlag), total));
  std::vector<std::chrono::steady_clock::time_point> seen(static_cast<std::size_t>(total) + 1);
  int missing = 0;
  for (int i = 1; i <= total; ++i) {
    const auto deadline = std::chrono::steady_clock::now() + kHostTimeout;
    for (unsigned spins = 1; *seq != i; ++spins) {
      _mm_pause();
      if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
        missing = i;
        break;
      }
    }
    if (missing != 0) break;
    seen[i] = std::chrono::steady_clock::now();
    *flag = i;
  }
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));  // the kernel has ended, answered or given up
  STRATA_EXPECTS(missing == 0, Error, "doorbell_round_trip: ring " + std::to_string(missing) + " of " +
                                          std::to_string(total) + " not seen within 2 s");
  std::vector<double> trips;
  for (int i = kWarmupRounds + 1; i < total; ++i) {
    trips.push_back(std::chrono::duration<double>(seen[i + 1] - seen[i]).count());
  }
  std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
  return trips[trips.size() / 2];
}

}  // namespace strata
