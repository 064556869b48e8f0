// Private helpers of the kernel_check hooks of the quantized products (kernel_check_gemv.cu,
// kernel_check_matmul.cu): device copies of a quantized tensor's planes, the q8_32 form of an activation on the
// device, and the median time of a launch. Host-side, allowed to allocate, synchronise and throw.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/quantize.cuh"
#include "../runtime/device_buffer.hpp"
#include "strata/error.hpp"
#include "strata/forms.hpp"

namespace strata::kernel_check::support {

constexpr std::size_t kPlaneAlign = 256;

inline std::size_t aligned(std::size_t bytes) { return (bytes + kPlaneAlign - 1) / kPlaneAlign * kPlaneAlign; }

// `copies` device copies of a quantized tensor's planes, each plane 256-byte aligned.
class DevicePlanes {
 public:
  DevicePlanes(const QuantForm& form, const QuantPlanes& host, long rows, int cols, int copies)
      : sizes_(plane_bytes(form, rows, cols)),
        stride_(aligned(sizes_.codes) + aligned(sizes_.d) + aligned(sizes_.sub_scales) + aligned(sizes_.mins) +
                aligned(sizes_.sub_mins)),
        buffer_(stride_ * copies) {
    for (int c = 0; c < copies; ++c) {
      const QuantPlanes dst = at(c);
      put(dst.codes, host.codes, sizes_.codes, "codes");
      put(dst.d, host.d, sizes_.d, "d");
      put(dst.sub_scales, host.sub_scales, sizes_.sub_scales, "sub_scales");
      put(dst.mins, host.mins, sizes_.mins, "mins");
      put(dst.sub_mins, host.sub_mins, sizes_.sub_mins, "sub_mins");
    }
  }
  QuantPlanes at(int copy) const {
    unsigned char* base = buffer_.as<unsigned char>() + stride_ * copy;
    QuantPlanes p;
    p.codes = base;
    base += aligned(sizes_.codes);
    p.d = base;
    base += aligned(sizes_.d);
    if (sizes_.sub_scales) p.sub_scales = reinterpret_cast<const std::int8_t*>(base);
    base += aligned(sizes_.sub_scales);
    if (sizes_.mins) p.mins = reinterpret_cast<const std::uint16_t*>(base);
    base += aligned(sizes_.mins);
    if (sizes_.sub_mins) p.sub_mins = base;
    return p;
  }

 private:
  static void put(const void* dst, const void* src, std::size_t bytes, const char* plane) {
    if (bytes == 0) return;
    STRATA_EXPECTS(src != nullptr, InvalidArgument, std::string("the form needs plane ") + plane);
    STRATA_CUDA_TRY(cudaMemcpy(const_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice));
  }
  PlaneBytes sizes_;
  std::size_t stride_;
  DeviceBuffer buffer_;
};

// The q8_32 form of x [n], on the device.
struct DeviceActivation {
  explicit DeviceActivation(long n)
      : xq(static_cast<std::size_t>(n)), dx(n / 32 * sizeof(float)), sums(n / 32 * sizeof(std::int32_t)) {}
  DeviceBuffer xq, dx, sums;

  // Quantizes x [n] (device memory) into this activation.
  cudaError_t quantize(const float* x, long n) const {
    return kernels::quantize_q8_32(x, xq.as<std::int8_t>(), dx.as<float>(), sums.as<std::int32_t>(), n, nullptr);
  }
};

// Median seconds per launch: `reps` timed batches, each cycling once (at least 8 launches) through `copies`.
template <class Launch>
double median_launch_seconds(int copies, int reps, Launch&& launch) {
  STRATA_EXPECTS(reps > 0, InvalidArgument, "timing needs reps > 0, got " + std::to_string(reps));
  const int batch = std::max(copies, 8);
  cudaEvent_t start, stop;
  STRATA_CUDA_TRY(cudaEventCreate(&start));
  STRATA_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> seconds;
  try {
    for (int i = 0; i < batch; ++i) STRATA_CUDA_TRY(launch(i % copies));  // warm-up (clocks, TLB)
    for (int r = 0; r < reps; ++r) {
      STRATA_CUDA_TRY(cudaEventRecord(start));
      for (int i = 0; i < batch; ++i) STRATA_CUDA_TRY(launch(i % copies));
      STRATA_CUDA_TRY(cudaEventRecord(stop));
      STRATA_CUDA_TRY(cudaEventSynchronize(stop));
      float ms = 0.0f;
      STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
      seconds.push_back(ms * 1e-3 / batch);
    }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return seconds[reps / 2];
}

}  // namespace strata::kernel_check::support
