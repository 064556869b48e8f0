#include "strata/self_test.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../kernels/norm.cuh"
#include "device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

constexpr int kRows = 64, kCols = 2560;
constexpr float kEps = 1e-6f;

}  // namespace

double self_test(int device) {
  require_device(device);
  DeviceScope scope(device);
  std::mt19937 random(std::random_device{}());
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(kRows) * kCols), w(kCols), y(x.size(), NAN);
  for (float& v : x) v = normal(random);
  for (float& v : w) v = normal(random);
  DeviceBuffer dx(sizeof(float) * x.size()), dw(sizeof(float) * w.size()), dy(sizeof(float) * y.size());
  STRATA_CUDA_TRY(cudaMemcpy(dx.as<float>(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(cudaMemcpy(dw.as<float>(), w.data(), dw.bytes(), cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(cudaMemcpy(dy.as<float>(), y.data(), dy.bytes(), cudaMemcpyHostToDevice));  // NaN: unwritten shows
  STRATA_CUDA_TRY(kernels::rms_norm(dx.as<float>(), dw.as<float>(), dy.as<float>(), kRows, kCols, kEps, nullptr));
  STRATA_CUDA_TRY(cudaMemcpy(y.data(), dy.as<float>(), dy.bytes(), cudaMemcpyDeviceToHost));
  double worst = 0.0, largest = 0.0;
  for (int r = 0; r < kRows; ++r) {
    const float* xr = x.data() + static_cast<std::size_t>(r) * kCols;
    double sum = 0.0;
    for (int c = 0; c < kCols; ++c) sum += static_cast<double>(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(sum / kCols + kEps);
    for (int c = 0; c < kCols; ++c) {
      const double want = xr[c] * inv * w[c];
      const double got = y[static_cast<std::size_t>(r) * kCols + c];
      if (!std::isfinite(got)) return INFINITY;  // NaN never passes
      worst = std::max(worst, std::fabs(got - want));
      largest = std::max(largest, std::fabs(want));
    }
  }
  return worst / largest;
}

}  // namespace strata
