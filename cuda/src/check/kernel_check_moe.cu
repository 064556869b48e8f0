// kernel_check entries of the MoE block's GPU kernels: the router, the shared expert's gate and SwiGLU, the
// combine with the routed experts' answer, and the VRAM-cached experts' slots and weighted sum.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../kernels/moe.cuh"
#include "../kernels/router.cuh"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

std::size_t floats(long n) { return static_cast<std::size_t>(n) * sizeof(float); }

void check_length(const char* kernel, int n) {
  STRATA_EXPECTS(n > 0, InvalidArgument, std::string(kernel) + " needs n > 0, got " + std::to_string(n));
}

}  // namespace

void moe_route(int device, const float* logits, int tokens, int n_expert, int k, std::int32_t* ids,
               float* weights) {
  STRATA_EXPECTS(tokens > 0 && n_expert > 0 && n_expert <= kernels::kRouterMaxExperts, InvalidArgument,
                 "moe_route needs tokens > 0 and 0 < n_expert <= " + std::to_string(kernels::kRouterMaxExperts) +
                     ", got " + std::to_string(tokens) + " x " + std::to_string(n_expert));
  STRATA_EXPECTS(k > 0 && k <= kernels::kRouterMaxTopK && k <= n_expert, InvalidArgument,
                 "moe_route needs 0 < k <= min(n_expert=" + std::to_string(n_expert) + ", " +
                     std::to_string(kernels::kRouterMaxTopK) + "), got k=" + std::to_string(k));
  check_device(device);
  DeviceScope scope(device);
  const long chosen = static_cast<long>(tokens) * k;
  DeviceBuffer d_logits = upload(logits, floats(static_cast<long>(tokens) * n_expert));
  GuardedOutput d_ids(static_cast<std::size_t>(chosen) * sizeof(std::int32_t));
  GuardedOutput d_weights(floats(chosen));
  STRATA_CUDA_TRY(kernels::moe_route(d_logits.as<float>(), d_ids.data<std::int32_t>(), d_weights.data<float>(),
                                     tokens, n_expert, k, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_ids.copy_out(ids, "moe_route (ids)");
  d_weights.copy_out(weights, "moe_route (weights)");
}

float shared_expert_gate(int device, const float* w, const float* x, int n) {
  check_length("shared_expert_gate", n);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_w = upload(w, floats(n));
  DeviceBuffer d_x = upload(x, floats(n));
  GuardedOutput d_gate(sizeof(float));
  STRATA_CUDA_TRY(kernels::shared_expert_gate(d_w.as<float>(), d_x.as<float>(), d_gate.data<float>(), n, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  float gate = 0.0f;
  d_gate.copy_out(&gate, "shared_expert_gate");
  return gate;
}

void swiglu(int device, const float* g, const float* u, float* h, int n) {
  check_length("swiglu", n);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_g = upload(g, floats(n));
  DeviceBuffer d_u = upload(u, floats(n));
  GuardedOutput d_h(floats(n));
  STRATA_CUDA_TRY(kernels::swiglu(d_g.as<float>(), d_u.as<float>(), d_h.data<float>(), n, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_h.copy_out(h, "swiglu");
}

void moe_combine(int device, const float* routed, const float* shared, float gate, float* out, int n) {
  check_length("moe_combine", n);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_routed = upload(routed, floats(n));
  DeviceBuffer d_shared = upload(shared, floats(n));
  DeviceBuffer d_gate = upload(&gate, sizeof(float));
  GuardedOutput d_out(floats(n));
  STRATA_CUDA_TRY(kernels::moe_combine(d_routed.as<float>(), d_shared.as<float>(), d_gate.as<float>(),
                                       d_out.data<float>(), n, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "moe_combine");
}

void expert_slots(int device, const std::int32_t* slot_of, int n_expert, const std::int32_t* ids, int k,
                  std::int32_t* slots) {
  STRATA_EXPECTS(n_expert > 0 && k > 0, InvalidArgument,
                 "expert_slots needs n_expert > 0 and k > 0, got " + std::to_string(n_expert) + " and " +
                     std::to_string(k));
  for (int j = 0; j < k; ++j) {
    STRATA_EXPECTS(ids[j] >= 0 && ids[j] < n_expert, InvalidArgument,
                   "expert_slots: ids[" + std::to_string(j) + "] = " + std::to_string(ids[j]) +
                       " is not an expert of " + std::to_string(n_expert));
  }
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_slot_of = upload(slot_of, static_cast<std::size_t>(n_expert) * sizeof(std::int32_t));
  DeviceBuffer d_ids = upload(ids, static_cast<std::size_t>(k) * sizeof(std::int32_t));
  GuardedOutput d_slots(static_cast<std::size_t>(k) * sizeof(std::int32_t));
  STRATA_CUDA_TRY(kernels::expert_slots(d_slot_of.as<int>(), d_ids.as<int>(), d_slots.data<int>(), k, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_slots.copy_out(slots, "expert_slots");
}

void moe_cached_sum(int device, const float* rows, const std::int32_t* slots, const float* weights, int k, int n,
                    bool accumulate, float* out) {
  STRATA_EXPECTS(k > 0 && n > 0, InvalidArgument,
                 "moe_cached_sum needs k > 0 and n > 0, got " + std::to_string(k) + " and " + std::to_string(n));
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_rows = upload(rows, floats(static_cast<long>(k) * n));
  DeviceBuffer d_slots = upload(slots, static_cast<std::size_t>(k) * sizeof(std::int32_t));
  DeviceBuffer d_weights = upload(weights, floats(k));
  GuardedOutput d_out(floats(n));
  if (accumulate) STRATA_CUDA_TRY(cudaMemcpy(d_out.data<float>(), out, floats(n), cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(kernels::moe_cached_sum(d_rows.as<float>(), d_slots.as<int>(), d_weights.as<float>(), k, n,
                                          accumulate, d_out.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "moe_cached_sum");
}

}  // namespace strata::kernel_check
