// Private helpers of the kernel_check harness (cuda/src/runtime/kernel_check*.cu): poisoned, guarded
// outputs, uploads and the device check. Host-side, allowed to allocate, synchronise and throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/quantize.cuh"
#include "../runtime/device_buffer.hpp"
#include "strata/check/q8_host.hpp"
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

// A kernel asked for a q8_32 form (host.xq given) must be given whole blocks: `unit` floats (its rows, heads,
// ...: what `name` names) a multiple of 32. Checked before any device work.
inline void check_q8_unit(const Q8Host& host, long unit, const std::string& kernel, const char* name) {
  STRATA_EXPECTS(!host.xq || unit % kernels::kQ8Block == 0, InvalidArgument,
                 kernel + ": a q8_32 output needs " + name + " a multiple of 32, got " + std::to_string(unit));
}

// Poisoned, guarded device outputs for the q8_32 form of rows of n floats (a multiple of 32: check_q8_unit) that
// a kernel writes beside its floats, when the host asks for one (its xq is given); blocks() is none otherwise.
class GuardedQ8 {
 public:
  GuardedQ8(const Q8Host& host, long n)
      : host_(host),
        n_(host.xq ? n : 0),
        xq_(n_),
        dx_(n_ / kernels::kQ8Block * sizeof(float)),
        sums_(n_ / kernels::kQ8Block * sizeof(std::int32_t)) {}
  kernels::Q8Blocks blocks() const {
    if (!host_.xq) return {};
    return {xq_.data<std::int8_t>(), dx_.data<float>(), sums_.data<std::int32_t>()};
  }
  // The form as the kernel left it into row `row` of the host's arrays (nothing when none was asked for).
  void copy_out(long row, const char* kernel) const {
    if (!host_.xq) return;
    const long blocks = n_ / kernels::kQ8Block;
    xq_.copy_out(host_.xq + row * n_, kernel);
    dx_.copy_out(host_.dx + row * blocks, kernel);
    sums_.copy_out(host_.sums + row * blocks, kernel);
  }

 private:
  Q8Host host_;
  long n_;
  GuardedOutput xq_, dx_, sums_;
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
