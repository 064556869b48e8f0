// One layer as the pool registered it: its matrices, their row kernels and which activations its jobs
// quantize (decided once at set_layer), and for a tiered layer its arena and policy. Shared by the per-token job
// (expert_pool.cpp) and the grouped one.
#pragma once

#include <array>
#include <memory>

#include "dot.hpp"
#include "expert_tier.hpp"

namespace strata::cpu {

struct PoolLayer {
  bool set = false;
  ExpertMatrix gate, up, down;
  RowsKernel gate_kernel = nullptr, up_kernel = nullptr, down_kernel = nullptr;
  bool quantize_x = false;  // gate or up is quantized
  bool quantize_h = false;  // down is quantized
  std::unique_ptr<TieredLayer> tier;  // null: every expert in the registered planes

  std::array<const ExpertMatrix*, kMatrices> matrices() const { return {&gate, &up, &down}; }
};

}  // namespace strata::cpu
