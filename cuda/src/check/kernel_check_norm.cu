// kernel_check entries of the norm family (grouped, gated, L2) and RoPE.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../kernels/norm.cuh"
#include "../kernels/rope.cuh"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

void check_positive(const char* kernel, long a, long b) {
  STRATA_EXPECTS(a > 0 && b > 0, InvalidArgument,
                 std::string(kernel) + " needs positive sizes, got " + std::to_string(a) + " x " + std::to_string(b));
}

std::size_t floats(long n) { return static_cast<std::size_t>(n) * sizeof(float); }

}  // namespace

void rms_norm_grouped(int device, const float* x, const float* w, float* y, int rows, int groups, int cols,
                      float eps) {
  check_positive("rms_norm_grouped", static_cast<long>(rows) * groups, cols);
  check_device(device);
  DeviceScope scope(device);
  const long n = static_cast<long>(rows) * groups * cols;
  DeviceBuffer d_x = upload(x, floats(n));
  DeviceBuffer d_w = upload(w, floats(static_cast<long>(groups) * cols));
  GuardedOutput d_y(floats(n));
  STRATA_CUDA_TRY(kernels::rms_norm_grouped(d_x.as<float>(), d_w.as<float>(), d_y.data<float>(), rows, groups, cols,
                                            eps, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "rms_norm_grouped");
}

void rms_norm_gated(int device, const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                    float eps, const std::string& gate, const Q8Host& y_q8) {
  check_positive("rms_norm_gated", heads, head_dim);
  STRATA_EXPECTS(gate == "sigmoid" || gate == "silu", InvalidArgument,
                 "rms_norm_gated: gate must be 'sigmoid' or 'silu', got '" + gate + "'");
  check_q8_unit(y_q8, head_dim, "rms_norm_gated", "head_dim");  // a CTA's head is whole blocks
  check_device(device);
  DeviceScope scope(device);
  const long n = static_cast<long>(heads) * head_dim;
  DeviceBuffer d_x = upload(x, floats(n));
  DeviceBuffer d_z = upload(z, floats(n));
  DeviceBuffer d_w = upload(w, floats(head_dim));
  GuardedOutput d_y(floats(n));
  const GuardedQ8 q8(y_q8, n);
  const kernels::Gate kind = gate == "sigmoid" ? kernels::Gate::Sigmoid : kernels::Gate::Silu;
  STRATA_CUDA_TRY(kernels::rms_norm_gated(d_x.as<float>(), d_z.as<float>(), d_w.as<float>(), d_y.data<float>(), heads,
                                          head_dim, eps, kind, nullptr, q8.blocks()));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "rms_norm_gated");
  q8.copy_out(0, "rms_norm_gated (q8_32)");
}

void l2_norm(int device, const float* x, float* y, int heads, int head_dim, float eps) {
  check_positive("l2_norm", heads, head_dim);
  check_device(device);
  DeviceScope scope(device);
  const long n = static_cast<long>(heads) * head_dim;
  DeviceBuffer d_x = upload(x, floats(n));
  GuardedOutput d_y(floats(n));
  STRATA_CUDA_TRY(kernels::l2_norm(d_x.as<float>(), d_y.data<float>(), heads, head_dim, eps, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "l2_norm");
}

void rope_neox(int device, const float* x, const std::int32_t* positions, float* y, int tokens, int heads,
               int head_dim, int rope_dim, double theta) {
  check_positive("rope_neox", static_cast<long>(tokens) * heads, head_dim);
  STRATA_EXPECTS(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim, InvalidArgument,
                 "rope_neox: rope_dim must be even and in (0, head_dim=" + std::to_string(head_dim) + "], got " +
                     std::to_string(rope_dim));
  const int max_position = *std::max_element(positions, positions + tokens) + 1;
  STRATA_EXPECTS(*std::min_element(positions, positions + tokens) >= 0, InvalidArgument,
                 "rope_neox: positions must be >= 0");
  check_device(device);
  DeviceScope scope(device);
  const long table = static_cast<long>(max_position) * (rope_dim / 2);
  std::vector<float> cos_table(table), sin_table(table);
  kernels::build_rope_tables(cos_table.data(), sin_table.data(), max_position, rope_dim, theta);
  DeviceBuffer d_cos = upload(cos_table.data(), floats(table));
  DeviceBuffer d_sin = upload(sin_table.data(), floats(table));
  DeviceBuffer d_pos = upload(positions, static_cast<std::size_t>(tokens) * sizeof(std::int32_t));
  const long n = static_cast<long>(tokens) * heads * head_dim;
  GuardedOutput d_y(floats(n));
  STRATA_CUDA_TRY(cudaMemcpy(d_y.data<float>(), x, floats(n), cudaMemcpyHostToDevice));  // RoPE works in place
  STRATA_CUDA_TRY(kernels::rope_neox(d_y.data<float>(), d_pos.as<std::int32_t>(), d_cos.as<float>(), d_sin.as<float>(),
                                     tokens, heads, head_dim, rope_dim, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "rope_neox");
}

}  // namespace strata::kernel_check
