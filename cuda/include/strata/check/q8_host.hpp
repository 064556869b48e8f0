// Host destinations of the q8_32 form that a kernel producing an activation writes beside its floats
// (docs/forms.md, "Activation contract"), for the test hooks that ask for it. Host-only header.
#pragma once

#include <cstdint>

namespace strata::kernel_check {

// For `rows` rows of n floats: xq [rows][n], dx and sums [rows][n / 32]. All null (the default): the hook asks
// the kernel for none and leaves the arrays alone.
struct Q8Host {
  std::int8_t* xq = nullptr;
  float* dx = nullptr;
  std::int32_t* sums = nullptr;
};

}  // namespace strata::kernel_check
