// Page-locked host memory mapped into the device's address space: what the doorbell and the per-token
// staging live in. Allocated once per session; freeing it synchronises the device, so never on the token path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "strata/error.hpp"

namespace strata {

class PinnedMapped {
 public:
  explicit PinnedMapped(std::size_t bytes) : bytes_(bytes) {
    STRATA_EXPECTS(bytes_ > 0, InvalidArgument, "pinned allocation of 0 bytes");
    STRATA_CUDA_TRY(cudaHostAlloc(&host_, bytes_, cudaHostAllocMapped));
    std::memset(host_, 0, bytes_);
    const cudaError_t status = cudaHostGetDevicePointer(&device_, host_, 0);
    if (status != cudaSuccess) {
      (void)cudaFreeHost(host_);
      STRATA_CUDA_TRY(status);
    }
  }
  PinnedMapped(const PinnedMapped&) = delete;
  PinnedMapped& operator=(const PinnedMapped&) = delete;
  PinnedMapped(PinnedMapped&& other) noexcept
      : host_(std::exchange(other.host_, nullptr)), device_(std::exchange(other.device_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  ~PinnedMapped() {
    if (host_) (void)cudaFreeHost(host_);
  }

  // The same bytes seen from the host and from the device, at `offset`.
  template <class T>
  T* host(std::size_t offset = 0) const noexcept { return reinterpret_cast<T*>(static_cast<char*>(host_) + offset); }
  template <class T>
  T* device(std::size_t offset = 0) const noexcept {
    return reinterpret_cast<T*>(static_cast<char*>(device_) + offset);
  }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace strata
