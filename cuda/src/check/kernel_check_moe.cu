// kernel_check entries of the MoE block's GPU kernels: the router, the shared expert's gate and SwiGLU, the
// combine with the routed experts' answer, the VRAM-cached experts' weighted sum, and a prompt chunk's
// row gather and per-token weighted sum of expert-grouped rows.
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

std::size_t ints(long n) { return static_cast<std::size_t>(n) * sizeof(std::int32_t); }

void check_length(const char* kernel, int n) {
  STRATA_EXPECTS(n > 0, InvalidArgument, std::string(kernel) + " needs n > 0, got " + std::to_string(n));
}

void check_rows(const char* kernel, int rows, int n) {
  STRATA_EXPECTS(rows > 0 && n > 0, InvalidArgument,
                 std::string(kernel) + " needs rows > 0 and n > 0, got " + std::to_string(rows) + " x " +
                     std::to_string(n));
}

// Every index[i] lies in [0, limit), or with skip_negative is negative (an entry the kernel skips): the kernels
// cannot check what they read, so the checks do before any device work.
void check_indices(const char* kernel, const char* what, const std::int32_t* index, long count, int limit,
                   const char* noun, bool skip_negative) {
  for (long i = 0; i < count; ++i) {
    STRATA_EXPECTS(index[i] < limit && (index[i] >= 0 || skip_negative), InvalidArgument,
                   std::string(kernel) + ": " + what + "[" + std::to_string(i) + "] = " + std::to_string(index[i]) +
                       " is not " + noun + " of " + std::to_string(limit));
  }
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

void shared_expert_gate(int device, const float* w, const float* x, int rows, int n, float* gate) {
  check_rows("shared_expert_gate", rows, n);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_w = upload(w, floats(n));
  DeviceBuffer d_x = upload(x, floats(static_cast<long>(rows) * n));
  GuardedOutput d_gate(floats(rows));
  STRATA_CUDA_TRY(kernels::shared_expert_gate(d_w.as<float>(), d_x.as<float>(), d_gate.data<float>(), rows, n,
                                              nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_gate.copy_out(gate, "shared_expert_gate");
}

void swiglu(int device, const float* g, const float* u, float* h, int n, const Q8Host& h_q8) {
  check_length("swiglu", n);
  check_q8_unit(h_q8, n, "swiglu", "n");
  check_device(device);
  DeviceScope scope(device);
  const GuardedQ8 q8(h_q8, n);
  DeviceBuffer d_g = upload(g, floats(n));
  DeviceBuffer d_u = upload(u, floats(n));
  GuardedOutput d_h(floats(n));
  STRATA_CUDA_TRY(kernels::swiglu(d_g.as<float>(), d_u.as<float>(), d_h.data<float>(), n, nullptr, q8.blocks()));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_h.copy_out(h, "swiglu");
  q8.copy_out(0, "swiglu (q8_32)");
}

void moe_combine(int device, const float* routed, const float* shared, const float* gate, float* out, int rows,
                 int n) {
  check_rows("moe_combine", rows, n);
  check_device(device);
  DeviceScope scope(device);
  const long elements = static_cast<long>(rows) * n;
  DeviceBuffer d_routed = upload(routed, floats(elements));
  DeviceBuffer d_shared = upload(shared, floats(elements));
  DeviceBuffer d_gate = upload(gate, floats(rows));
  GuardedOutput d_out(floats(elements));
  STRATA_CUDA_TRY(kernels::moe_combine(d_routed.as<float>(), d_shared.as<float>(), d_gate.as<float>(),
                                       d_out.data<float>(), rows, n, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "moe_combine");
}

void moe_cached_sum(int device, const float* rows, const std::int32_t* slots, const float* weights, int tokens,
                    int k, int n, bool accumulate, float* out) {
  STRATA_EXPECTS(tokens > 0 && k > 0 && n > 0, InvalidArgument,
                 "moe_cached_sum needs tokens, k and n > 0, got " + std::to_string(tokens) + ", " + std::to_string(k) +
                     " and " + std::to_string(n));
  check_device(device);
  DeviceScope scope(device);
  const long chosen = static_cast<long>(tokens) * k, elements = static_cast<long>(tokens) * n;
  DeviceBuffer d_rows = upload(rows, floats(chosen * n));
  DeviceBuffer d_slots = upload(slots, ints(chosen));
  DeviceBuffer d_weights = upload(weights, floats(chosen));
  GuardedOutput d_out(floats(elements));
  if (accumulate) STRATA_CUDA_TRY(cudaMemcpy(d_out.data<float>(), out, floats(elements), cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(kernels::moe_cached_sum(d_rows.as<float>(), d_slots.as<int>(), d_weights.as<float>(), tokens, k,
                                          n, accumulate, d_out.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "moe_cached_sum");
}

void moe_weighted_rows(int device, const float* rows, int n_rows, const std::int32_t* row_of, const float* weights,
                       int tokens, int k, int n, float* out) {
  STRATA_EXPECTS(n_rows > 0 && tokens > 0 && k > 0 && n > 0, InvalidArgument,
                 "moe_weighted_rows needs n_rows, tokens, k and n > 0, got " + std::to_string(n_rows) + ", " +
                     std::to_string(tokens) + ", " + std::to_string(k) + " and " + std::to_string(n));
  const long chosen = static_cast<long>(tokens) * k;
  check_indices("moe_weighted_rows", "row_of", row_of, chosen, n_rows, "a row", true);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_rows = upload(rows, floats(static_cast<long>(n_rows) * n));
  DeviceBuffer d_row_of = upload(row_of, ints(chosen));
  DeviceBuffer d_weights = upload(weights, floats(chosen));
  GuardedOutput d_out(floats(static_cast<long>(tokens) * n));
  STRATA_CUDA_TRY(kernels::moe_weighted_rows(d_rows.as<float>(), d_row_of.as<int>(), d_weights.as<float>(), tokens,
                                             k, n, d_out.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "moe_weighted_rows");
}

void gather_rows(int device, const float* src, int src_rows, const std::int32_t* index, int m, int n, float* dst) {
  STRATA_EXPECTS(src_rows > 0 && m > 0 && n > 0, InvalidArgument,
                 "gather_rows needs src_rows, m and n > 0, got " + std::to_string(src_rows) + ", " +
                     std::to_string(m) + " and " + std::to_string(n));
  check_indices("gather_rows", "index", index, m, src_rows, "a row", false);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_src = upload(src, floats(static_cast<long>(src_rows) * n));
  DeviceBuffer d_index = upload(index, ints(m));
  GuardedOutput d_dst(floats(static_cast<long>(m) * n));
  STRATA_CUDA_TRY(kernels::gather_rows(d_src.as<float>(), d_index.as<int>(), m, n, d_dst.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_dst.copy_out(dst, "gather_rows");
}

void cache_slots(int device, const std::int32_t* slot_of, int n_expert, const std::int32_t* ids, int count,
                 std::int32_t* slots) {
  STRATA_EXPECTS(n_expert > 0 && count > 0, InvalidArgument,
                 "cache_slots needs n_expert and count > 0, got " + std::to_string(n_expert) + " and " +
                     std::to_string(count));
  check_indices("cache_slots", "ids", ids, count, n_expert, "an expert", false);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_slot_of = upload(slot_of, ints(n_expert));
  DeviceBuffer d_ids = upload(ids, ints(count));
  GuardedOutput d_slots(ints(count));
  STRATA_CUDA_TRY(kernels::cache_slots(d_slot_of.as<int>(), d_ids.as<std::int32_t>(), count, d_slots.data<int>(),
                                       nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_slots.copy_out(slots, "cache_slots");
}

}  // namespace strata::kernel_check
