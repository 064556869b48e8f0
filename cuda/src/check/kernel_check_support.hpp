// Private helpers of the kernel_check harness (cuda/src/runtime/kernel_check*.cu): poisoned, guarded
// outputs, uploads and the device check. Host-side, allowed to allocate, synchronise and throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "../runtime/device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata::kernel_check::support {

constexpr std::size_t kGuardBytes = 4096;
constexpr unsigned char kPoison = 0xFF;  // every float made of 0xFF bytes is a NaN

// An output buffer with poisoned guard bands on both sides; copy_out() proves the kernel stayed inside.
class GuardedOutput {
 public:
  explicit GuardedOutput(std::size_t bytes) : bytes_(bytes), buffer_(bytes + 2 * kGuardBytes) {
    STRATA_CUDA_TRY(cudaMemset(buffer_.as<unsigned char>(), kPoison, buffer_.bytes()));
  }
  template <class T>
  T* data() const noexcept { return reinterpret_cast<T*>(buffer_.as<unsigned char>() + kGuardBytes); }

  void copy_out(void* host, const char* kernel) const {
    std::vector<unsigned char> all(buffer_.bytes());
    STRATA_CUDA_TRY(cudaMemcpy(all.data(), buffer_.as<unsigned char>(), all.size(), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
      STRATA_EXPECTS(all[i] == kPoison && all[kGuardBytes + bytes_ + i] == kPoison, Error,
                     std::string(kernel) + " wrote outside its output buffer");
    }
    std::memcpy(host, all.data() + kGuardBytes, bytes_);
  }

 private:
  std::size_t bytes_;
  DeviceBuffer buffer_;
};

inline DeviceBuffer upload(const void* host, std::size_t bytes) {
  DeviceBuffer buffer(bytes);
  STRATA_CUDA_TRY(cudaMemcpy(buffer.as<void>(), host, bytes, cudaMemcpyHostToDevice));
  return buffer;
}

inline void check_device(int device) {
  const int count = device_count();
  STRATA_EXPECTS(count > 0, InvalidArgument, "no CUDA device is available");
  require_device(device);
}

}  // namespace strata::kernel_check::support
