#include "strata/kernel_check.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../kernels/norm.cuh"
#include "device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata::kernel_check {
namespace {

constexpr std::size_t kGuardBytes = 4096;
constexpr unsigned char kPoison = 0xFF;  // every float made of 0xFF bytes is a NaN

// An output buffer with poisoned guard bands on both sides; check() proves the kernel stayed inside.
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

DeviceBuffer upload(const void* host, std::size_t bytes) {
  DeviceBuffer buffer(bytes);
  STRATA_CUDA_TRY(cudaMemcpy(buffer.as<void>(), host, bytes, cudaMemcpyHostToDevice));
  return buffer;
}

void check_device(int device) {
  const int count = device_count();
  STRATA_EXPECTS(count > 0, InvalidArgument, "no CUDA device is available");
  STRATA_EXPECTS(device >= 0 && device < count, InvalidArgument,
                 "device index " + std::to_string(device) + " out of range: " + std::to_string(count) +
                     " CUDA device(s) present");
}

}  // namespace

void rms_norm(int device, const float* x, const float* w, float* y, int rows, int cols, float eps) {
  STRATA_EXPECTS(rows > 0 && cols > 0, InvalidArgument,
                 "rms_norm needs rows > 0 and cols > 0, got " + std::to_string(rows) + " x " + std::to_string(cols));
  check_device(device);
  DeviceScope scope(device);
  const std::size_t bytes = static_cast<std::size_t>(rows) * cols * sizeof(float);
  DeviceBuffer dx = upload(x, bytes);
  DeviceBuffer dw = upload(w, static_cast<std::size_t>(cols) * sizeof(float));
  GuardedOutput dy(bytes);
  STRATA_CUDA_TRY(kernels::rms_norm(dx.as<float>(), dw.as<float>(), dy.data<float>(), rows, cols, eps, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  dy.copy_out(y, "rms_norm");
}

void raise_error(const std::string& kind) {
  if (kind == "invalid_argument") throw InvalidArgument("test: invalid argument");
  if (kind == "out_of_memory") throw OutOfMemory("test: out of memory");
  if (kind == "format") throw FormatError("test: format error");
  if (kind == "cuda") STRATA_CUDA_TRY(cudaErrorInvalidValue);
  if (kind == "error") throw Error("test: generic error");
  throw InvalidArgument("raise_error: unknown kind '" + kind + "'");
}

}  // namespace strata::kernel_check
