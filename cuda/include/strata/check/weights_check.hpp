// Test hooks over uploaded DeviceWeights: run the GEMV kernels on a tensor exactly as the session will,
// so tests prove that the load layout and the kernels' contract agree. Allocates and synchronises.
#pragma once

#include <string>

#include "strata/device_weights.hpp"

namespace strata::weights_check {

// y [rows] = W x with W the uploaded tensor `name` (quantized forms take x as q8_32, as in a decode step).
void gemv(const DeviceWeights& weights, const std::string& name, const float* x, float* y);

}  // namespace strata::weights_check
