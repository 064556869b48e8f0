// kernel_check entries of the MoE block's GPU kernels: the router, the shared expert's gate and SwiGLU, and
// the combine with the routed experts' answer.
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

}  // namespace strata::kernel_check
