// One layer as the pool registered it: its matrices, their row kernels and which activations its jobs
// quantize (decided once at set_layer). Shared by the per-token job (expert_pool.cpp) and the grouped one.
#pragma once

#include "dot.hpp"

namespace strata::cpu {

struct PoolLayer {
  bool set = false;
  ExpertMatrix gate, up, down;
  RowsKernel gate_kernel = nullptr, up_kernel = nullptr, down_kernel = nullptr;
  bool quantize_x = false;  // gate or up is quantized
  bool quantize_h = false;  // down is quantized
};

}  // namespace strata::cpu
