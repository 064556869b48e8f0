// Host round trips of single kernels, so Python tests can check each one against the numpy reference.
// Each call copies its inputs to the device, poisons the output (NaN bytes) inside guard bands, runs the
// kernel, verifies that the guard bands are untouched, and copies the output back. Not for the token path:
// these allocate and synchronise.
#pragma once

#include <string>

namespace strata::kernel_check {

// y = rms_norm(x) * w over `rows` rows of `cols` floats, computed on `device`.
void rms_norm(int device, const float* x, const float* w, float* y, int rows, int cols, float eps);

// Throws the error kind named by `kind` ("invalid_argument", "out_of_memory", "format", "cuda", "error"),
// so tests can prove that each arrives in Python as the right exception.
void raise_error(const std::string& kind);

}  // namespace strata::kernel_check
