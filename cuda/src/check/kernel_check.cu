#include "strata/check/kernel_check.hpp"

#include <cuda_runtime.h>

#include "../kernels/norm.cuh"
#include "kernel_check_support.hpp"

namespace strata::kernel_check {
using namespace support;

void rms_norm(int device, const float* x, const float* w, float* y, int rows, int cols, float eps,
              const Q8Host& y_q8) {
  STRATA_EXPECTS(rows > 0 && cols > 0, InvalidArgument,
                 "rms_norm needs rows > 0 and cols > 0, got " + std::to_string(rows) + " x " + std::to_string(cols));
  check_q8_unit(y_q8, cols, "rms_norm", "cols");
  check_device(device);
  DeviceScope scope(device);
  const std::size_t bytes = static_cast<std::size_t>(rows) * cols * sizeof(float);
  DeviceBuffer dx = upload(x, bytes);
  DeviceBuffer dw = upload(w, static_cast<std::size_t>(cols) * sizeof(float));
  GuardedOutput dy(bytes);
  const GuardedQ8 q8(y_q8, static_cast<long>(rows) * cols);
  STRATA_CUDA_TRY(kernels::rms_norm(dx.as<float>(), dw.as<float>(), dy.data<float>(), rows, cols, eps, nullptr,
                                    q8.blocks()));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  dy.copy_out(y, "rms_norm");
  q8.copy_out(0, "rms_norm (q8_32)");
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
