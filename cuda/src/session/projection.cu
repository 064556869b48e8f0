#include "projection.hpp"

#include "../kernels/gemv.cuh"
#include "../kernels/quantize.cuh"
#include "strata/error.hpp"

namespace strata {

void project(const float* x, std::initializer_list<Product> products, const Q8Scratch& q8, cudaStream_t stream) {
  bool quantized = false;
  for (const Product& p : products) {
    if (!p.w->is_float) {
      if (!quantized) STRATA_CUDA_TRY(kernels::quantize_q8_32(x, q8.xq, q8.dx, q8.sums, p.w->cols, stream));
      quantized = true;
    }
  }
  for (const Product& p : products) {
    const DeviceTensor& w = *p.w;
    if (w.is_float) {
      STRATA_CUDA_TRY(kernels::gemv_float(w.float_kind, w.data, static_cast<int>(w.rows), static_cast<int>(w.cols),
                                          x, p.y, stream));
    } else {
      STRATA_CUDA_TRY(kernels::gemv_quant(w.form, w.planes, static_cast<int>(w.rows), static_cast<int>(w.cols),
                                          q8.xq, q8.dx, q8.sums, p.y, stream));
    }
  }
}

}  // namespace strata
