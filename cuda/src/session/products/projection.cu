#include "projection.hpp"

#include <algorithm>
#include <string>

#include "../../kernels/quantize.cuh"
#include "strata/error.hpp"

namespace strata {

Branches::Branches() {
  try {
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (int i = 0; i < kMax; ++i) {
      STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&side_[i], cudaStreamNonBlocking));
      STRATA_CUDA_TRY(cudaEventCreateWithFlags(&join_[i], cudaEventDisableTiming));
    }
  } catch (...) {
    this->~Branches();
    throw;
  }
}

Branches::~Branches() {
  for (int i = 0; i < kMax; ++i) {
    if (side_[i]) (void)cudaStreamDestroy(side_[i]);
    if (join_[i]) (void)cudaEventDestroy(join_[i]);
  }
  if (fork_) (void)cudaEventDestroy(fork_);
}

namespace {

void gemv(const Product& p, const Q8Scratch& q8, const float* x, cudaStream_t stream) {
  const DeviceTensor& w = *p.w;
  if (w.is_float) {
    STRATA_CUDA_TRY(kernels::gemv_float(w.float_kind, w.data, static_cast<int>(w.rows), static_cast<int>(w.cols), x,
                                        p.y, stream));
  } else {
    STRATA_CUDA_TRY(kernels::gemv_quant(w.form, w.planes, static_cast<int>(w.rows), static_cast<int>(w.cols), q8.xq,
                                        q8.dx, q8.sums, p.y, stream));
  }
}

}  // namespace

void quantize(const float* x, long n, const Q8Scratch& q8, cudaStream_t stream) {
  STRATA_CUDA_TRY(kernels::quantize_q8_32(x, q8.xq, q8.dx, q8.sums, n, stream));
}

void project_batch(const DeviceTensor& stack, const kernels::MatrixBatch& batch, const float* x, const Q8Scratch& q8,
                   float* y, cudaStream_t stream) {
  const int rows = static_cast<int>(stack.rows), cols = static_cast<int>(stack.cols);
  if (stack.is_float) {
    STRATA_CUDA_TRY(kernels::gemv_float_batch(stack.float_kind, stack.data, rows, cols, batch, x, y, stream));
  } else {
    STRATA_CUDA_TRY(kernels::gemv_quant_batch(stack.form, stack.planes, rows, cols, batch, q8.xq, q8.dx, q8.sums, y,
                                              stream));
  }
}

void project_inputs(const DeviceTensor& w, int inputs, const float* x, const Q8Scratch& q8, float* y,
                    cudaStream_t stream) {
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
  if (w.is_float) {
    STRATA_CUDA_TRY(kernels::gemv_float_inputs(w.float_kind, w.data, rows, cols, inputs, cols, x, y, stream));
  } else {
    STRATA_CUDA_TRY(kernels::gemv_quant_inputs(w.form, w.planes, rows, cols, inputs, cols, q8.xq, q8.dx, q8.sums, y,
                                               stream));
  }
}

int rows_per_launch(const DeviceTensor& w) {
  return w.is_float ? kernels::kMaxFloatInputs
                    : kernels::gemv_quant_max_inputs(w.form, static_cast<int>(w.rows), static_cast<int>(w.cols));
}

void route_and_publish(const DeviceTensor& router, const float* x, const Q8Scratch& q8, int k,
                       const kernels::RouteTargets& out, const kernels::RoutePublish& publish, cudaStream_t stream) {
  const kernels::RouterMatrix w{weight_matrix(router), static_cast<int>(router.rows), static_cast<int>(router.cols)};
  const kernels::RouterInput input{x, q8.xq, q8.dx, q8.sums};
  STRATA_CUDA_TRY(kernels::route_publish(w, input, k, out, publish, stream));
}

Products::Products(std::initializer_list<Product> products) : n_(static_cast<int>(products.size())) {
  STRATA_EXPECTS(n_ <= kMax, InvalidArgument,
                 "projection: " + std::to_string(n_) + " products of one input, more than the " +
                     std::to_string(kMax) + " a list holds");
  std::copy(products.begin(), products.end(), list_);
}

const DeviceTensor* Products::q8_reader() const {
  const Product* reader = std::find_if(begin(), end(), [](const Product& p) { return reads_q8(*p.w); });
  return reader == end() ? nullptr : reader->w;
}

void quantize_for(const float* x, const Products& readers, const Q8Scratch& q8, cudaStream_t stream) {
  if (const DeviceTensor* reader = readers.q8_reader()) quantize(x, reader->cols, q8, stream);
}

void project(const float* x, const Products& products, const Q8Scratch& q8, cudaStream_t stream,
             const Branches* branches) {
  quantize_for(x, products, q8, stream);
  project_quantized(x, products, q8, stream, branches);
}

void project_quantized(const float* x, const Products& products, const Q8Scratch& q8, cudaStream_t stream,
                       const Branches* branches) {
  const Product* list = products.begin();
  if (branches && products.size() > 1) {
    branches->run(products.size(), stream, [&](int i, cudaStream_t s) { gemv(list[i], q8, x, s); });
    return;
  }
  for (const Product& p : products) gemv(p, q8, x, stream);
}

}  // namespace strata

namespace strata {

void multiply_rows(const DeviceTensor& w, const kernels::MatmulRows& rows, const kernels::MatmulGroups* groups,
                   const float* x, const Q8Scratch& q8, float* y, cudaStream_t stream) {
  const int r = static_cast<int>(w.rows), c = static_cast<int>(w.cols);
  if (w.is_float) {
    STRATA_CUDA_TRY(groups ? kernels::matmul_float_grouped(w.float_kind, w.data, r, c, rows, *groups, x, y, stream)
                           : kernels::matmul_float(w.float_kind, w.data, r, c, rows, x, y, stream));
  } else {
    STRATA_CUDA_TRY(groups
                        ? kernels::matmul_quant_grouped(w.form, w.planes, r, c, rows, *groups, q8.xq, q8.dx, y, stream)
                        : kernels::matmul_quant(w.form, w.planes, r, c, rows, q8.xq, q8.dx, y, stream));
  }
}

}  // namespace strata
