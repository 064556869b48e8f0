// How strata launches its kernels: programmatic dependent launch (PDL) on compute capability >= 9.0.
//
// A decoded token runs many small kernels, each a few microseconds of work behind a launch's ramp. With PDL the
// next kernel in the stream is launched while the one before still runs: its CTAs become resident and block in
// griddepcontrol.wait until that kernel has completed and its writes are visible, which hides the ramp. It works
// in stream capture too: the graph's edges between such kernels are programmatic. The device is asked for PDL by
// its compute capability, so a >= 9.0 device must run code built for >= 9.0 (the default architectures' SASS, or
// their PTX): PTX of an older architecture, JIT-compiled there, would have no wait.
//
// THE RULE: every kernel launched through launch() calls await_producers() as its very first statement,
// unconditionally, in every thread, before any global-memory read or write and before any early return (only
// prefetch_constant_rows() of its constant weights may come before it); then
// release_consumers(), so the kernel after it may launch. Why every thread and before a return: a kernel waits
// only for the completion of the kernel just before it, so the chain A -> B -> C holds only because B completes
// after A; a B whose CTAs returned without waiting could complete first and let C read what A has not written.
// tests/kernels/test_kernel_launch_rule.py holds every __global__ under cuda/src to this rule and refuses <<<>>>.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <utility>

namespace strata::kernels {

// Blocks until the kernels this one depends on have completed and their writes are visible. Below sm_90 there
// is no programmatic launch (launch() never asks for one there), so stream order alone already guarantees it.
__device__ __forceinline__ void await_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Asks L2 for rows first_row .. first_row + rows - 1 (those below total_rows) of a row-major plane of CONSTANT data
// (a matrix of the model's weights, which no kernel writes), so that a kernel's weights come from HBM while it
// waits for its producer: the one thing THE RULE lets a kernel do before await_producers() (what it asks for no
// producer writes). One bulk prefetch by the CTA's first thread, 16-byte aligned inside the rows (a row's few
// unaligned bytes at either end are left to the loads); a null plane asks for nothing (a batch whose matrices the
// producer's routing names). A hint: nothing waits for it, and it changes no result.
__device__ __forceinline__ void prefetch_constant_rows(const void* plane, long row_bytes, long first_row, long rows,
                                                       long total_rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (plane == nullptr || threadIdx.x != 0) return;
  const long end_row = first_row + rows < total_rows ? first_row + rows : total_rows;
  if (end_row <= first_row) return;
  const unsigned long long base = reinterpret_cast<unsigned long long>(plane);
  const unsigned long long start = (base + first_row * row_bytes + 15) & ~15ull;
  const unsigned long long end = (base + end_row * row_bytes) & ~15ull;
  if (end <= start) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(start), "r"(static_cast<unsigned>(end - start))
               : "memory");
#endif
}

// Lets the next kernel in the stream launch now; it still waits in await_producers() for this one to complete.
__device__ __forceinline__ void release_consumers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

namespace launch_detail {

// Whether the current device runs programmatic dependent launch (compute capability >= 9.0), asked once per
// device: launches happen per token, the answer never changes. Racing first askers store the same answer.
inline cudaError_t programmatic_launch_allowed(bool* allowed) {
  constexpr int kCachedDevices = 64;  // a device numbered beyond it is asked at every launch
  static std::atomic<signed char> known[kCachedDevices];  // 0: not asked yet, 1: no, 2: yes
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const signed char answer = known[device].load(std::memory_order_relaxed);
    if (answer != 0) {
      *allowed = answer == 2;
      return cudaSuccess;
    }
  }
  int major = 0;
  status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status != cudaSuccess) return status;
  *allowed = major >= 9;
  if (cached) known[device].store(*allowed ? 2 : 1, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace launch_detail

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in clusters of `cluster` CTAs along x (sm_90's thread
// block clusters, whose CTAs read each other's shared memory; 1: no clusters, grid.x a multiple of it otherwise),
// with programmatic stream serialisation where the device has it; args convert to the kernel's parameter types.
// Capturable: no synchronisation, no allocation. Returns the launch's error and, like <<<>>> followed by
// cudaGetLastError(), leaves none pending behind it.
template <typename... Params, typename... Args>
cudaError_t launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                             cudaStream_t stream, unsigned cluster, Args&&... args) {
  bool programmatic = false;
  cudaError_t status = launch_detail::programmatic_launch_allowed(&programmatic);
  if (status == cudaSuccess) {
    cudaLaunchAttribute attributes[2]{};
    unsigned count = 0;
    if (programmatic) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count++].val.clusterDim = {cluster, 1, 1};
    }
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = count ? attributes : nullptr;
    config.numAttrs = count;
    status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}

// launch_clustered without clusters: what every kernel but the clustered ones uses.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  return launch_clustered(kernel, grid, block, shared_bytes, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace strata::kernels
