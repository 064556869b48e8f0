#include "strata/check/kernel_check_launch.hpp"

#include <cuda_runtime.h>

#include <string>

#include "../kernels/launch.cuh"
#include "../runtime/device_buffer.hpp"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata::kernel_check {
namespace {

constexpr int kChainThreads = 128;

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");  // "memory": the read stays before the spin
  return t;
}

// One link: the counter as the kernel before left it, plus one, written only after the spin, so a link that
// read early (its predecessor still spinning) writes a count one short.
__global__ void chain_link_kernel(int* counters, int cells, long long spin_ns) {
  kernels::await_producers();
  kernels::release_consumers();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cells) return;
  const int seen = *static_cast<volatile int*>(counters + i);
  const unsigned long long start = global_timer_ns();
  while (global_timer_ns() - start < static_cast<unsigned long long>(spin_ns)) __nanosleep(100);
  counters[i] = seen + 1;
}

}  // namespace

std::vector<int> launch_chain(int device, int links, int cells, long long spin_ns, LaunchChainStream where) {
  STRATA_EXPECTS(links >= 1 && cells >= 1 && spin_ns >= 0, InvalidArgument,
                 "launch_chain: links and cells must be >= 1 and spin_ns >= 0, got " + std::to_string(links) + ", " +
                     std::to_string(cells) + ", " + std::to_string(spin_ns));
  require_device(device);
  DeviceScope scope(device);
  DeviceBuffer counters(sizeof(int) * cells);
  Stream owned;
  const cudaStream_t stream = where == LaunchChainStream::Legacy ? nullptr : owned.get();  // null: as the checks
  STRATA_CUDA_TRY(cudaMemsetAsync(counters.as<int>(), 0, sizeof(int) * cells, stream));
  const unsigned grid = static_cast<unsigned>((cells + kChainThreads - 1) / kChainThreads);
  auto enqueue = [&](cudaStream_t s) {
    for (int l = 0; l < links; ++l) {
      STRATA_CUDA_TRY(
          kernels::launch(chain_link_kernel, grid, kChainThreads, 0, s, counters.as<int>(), cells, spin_ns));
    }
  };
  if (where == LaunchChainStream::Captured) {
    const CapturedGraph graph(stream, enqueue);
    graph.launch(stream);
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  } else {
    enqueue(stream);
  }
  std::vector<int> out(static_cast<std::size_t>(cells));
  STRATA_CUDA_TRY(
      cudaMemcpyAsync(out.data(), counters.as<int>(), sizeof(int) * cells, cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace strata::kernel_check
