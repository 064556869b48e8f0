// Owning device allocations for host-side code that is allowed to allocate (load, tests).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "strata/error.hpp"

namespace strata {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) STRATA_CUDA_TRY(cudaMalloc(&ptr_, bytes_));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);  // destructors never throw
  }

  template <class T>
  T* as() const noexcept { return static_cast<T*>(ptr_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Makes `device` current for a scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    STRATA_CUDA_TRY(cudaGetDevice(&previous_));
    STRATA_CUDA_TRY(cudaSetDevice(device));
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace strata
