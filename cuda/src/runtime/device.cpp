#include "strata/device.hpp"

#include <cuda_runtime_api.h>

#include "strata/error.hpp"

namespace strata {

int device_count() noexcept {
  int count = 0;
  // Without a driver this returns cudaErrorInsufficientDriver or cudaErrorNoDevice: both mean "none".
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void require_device(int index) {
  const int count = device_count();
  STRATA_EXPECTS(index >= 0 && index < count, InvalidArgument,
                 "device index " + std::to_string(index) + " out of range: " + std::to_string(count) +
                     " CUDA device(s) present");
}

void require_free_memory(std::size_t bytes, int device, const std::string& what, const std::string& hint) {
  std::size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  STRATA_EXPECTS(bytes <= free_bytes, OutOfMemory,
                 what + " need " + std::to_string(bytes >> 20) + " MiB of VRAM, device " + std::to_string(device) +
                     " has " + std::to_string(free_bytes >> 20) + " MiB free" + (hint.empty() ? "" : "; " + hint));
}

DeviceInfo device_info(int index) {
  require_device(index);
  cudaDeviceProp prop{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&prop, index));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.sm_count = prop.multiProcessorCount;

  int previous = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&previous));
  STRATA_CUDA_TRY(cudaSetDevice(index));
  std::size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  STRATA_CUDA_TRY(cudaSetDevice(previous));
  STRATA_CUDA_TRY(status);
  info.free_memory = free_bytes;
  return info;
}

namespace {

// A version query that reports 0 instead of failing (no driver installed, for one).
int version_or_zero(cudaError_t (*query)(int*)) noexcept {
  int version = 0;
  if (query(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return version;
}

}  // namespace

int driver_version() noexcept { return version_or_zero(cudaDriverGetVersion); }

int runtime_version() noexcept { return version_or_zero(cudaRuntimeGetVersion); }

}  // namespace strata
