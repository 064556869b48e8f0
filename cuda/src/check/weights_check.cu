#include "strata/check/weights_check.hpp"

#include <cuda_runtime.h>

#include "../kernels/gemv.cuh"
#include "../kernels/quantize.cuh"
#include "kernel_check_support.hpp"

namespace strata::weights_check {

void gemv(const DeviceWeights& weights, const std::string& name, const float* x, float* y) {
  const DeviceTensor& t = weights.get(name);
  DeviceScope scope(weights.device());
  const auto cols = static_cast<std::size_t>(t.cols);
  DeviceBuffer dx(cols * sizeof(float));
  STRATA_CUDA_TRY(cudaMemcpy(dx.as<float>(), x, dx.bytes(), cudaMemcpyHostToDevice));
  kernel_check::support::GuardedOutput out(static_cast<std::size_t>(t.rows) * sizeof(float));
  if (t.is_float) {
    STRATA_CUDA_TRY(kernels::gemv_float(t.float_kind, t.data, static_cast<int>(t.rows), static_cast<int>(t.cols),
                                        dx.as<float>(), out.data<float>(), nullptr));
  } else {
    DeviceBuffer xq(cols), scales(cols / kernels::kQ8Block * sizeof(float)),
        sums(cols / kernels::kQ8Block * sizeof(std::int32_t));
    STRATA_CUDA_TRY(kernels::quantize_q8_32(dx.as<float>(), xq.as<std::int8_t>(), scales.as<float>(),
                                            sums.as<std::int32_t>(), static_cast<long>(cols), nullptr));
    STRATA_CUDA_TRY(kernels::gemv_quant(t.form, t.planes, static_cast<int>(t.rows), static_cast<int>(t.cols),
                                        xq.as<std::int8_t>(), scales.as<float>(), sums.as<std::int32_t>(),
                                        out.data<float>(), nullptr));
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  out.copy_out(y, ("gemv of " + name).c_str());
}

}  // namespace strata::weights_check
