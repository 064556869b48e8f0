// y = W x for the decode program: one q8_32 quantization of x shared by every quantized weight that reads
// it, then the GEMV for each weight's form. Enqueues only (no allocation, no synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "strata/device_weights.hpp"

namespace strata {

// One weight and where its output goes.
struct Product {
  const DeviceTensor* w;
  float* y;
};

// The q8_32 form of one activation vector (kernels/quantize.cuh), reused by every projection in turn.
struct Q8Scratch {
  std::int8_t* xq = nullptr;
  float* dx = nullptr;
  std::int32_t* sums = nullptr;
};

// Enqueues y = W x for every product; x has the weights' column count. Throws CudaError on a launch error.
void project(const float* x, std::initializer_list<Product> products, const Q8Scratch& q8, cudaStream_t stream);

}  // namespace strata
