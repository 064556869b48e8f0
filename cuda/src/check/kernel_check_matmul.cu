// kernel_check entries of the matrix products (kernels/matmul.cuh): the quantized and float products, dense or
// in groups over a stack, and their timing for benchmarks/bench_matmul.py.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/matmul.cuh"
#include "kernel_check_quant.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_matmul.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

std::string shape_text(long a, long b) { return std::to_string(a) + " x " + std::to_string(b); }

// Checks a product's arguments before any device work; x_stride_multiple is 32 for the quantized forms.
void check_rows(const std::string& hook, int n_matrix, int rows, int cols, const MatmulCheckRows& r,
                int x_stride_multiple) {
  STRATA_EXPECTS(rows > 0 && cols > 0, InvalidArgument,
                 hook + " needs rows > 0 and cols > 0, got " + shape_text(rows, cols));
  STRATA_EXPECTS(n_matrix >= 1, InvalidArgument,
                 hook + " needs a stack of at least one matrix, got " + std::to_string(n_matrix));
  STRATA_EXPECTS(r.groups >= 0 && r.groups < kernels::kMaxMatmulGridColumns, InvalidArgument,
                 hook + " needs 0 <= groups < " + std::to_string(kernels::kMaxMatmulGridColumns) + ", got " +
                     std::to_string(r.groups));
  const long limit = kernels::matmul_max_rows(r.groups);
  STRATA_EXPECTS(r.count >= 1 && r.count <= limit, InvalidArgument,
                 hook + " needs 1 <= x rows <= " + std::to_string(limit) + " (" + std::to_string(r.groups) +
                     " groups), got " + std::to_string(r.count));
  const std::string multiple =
      x_stride_multiple > 1 ? " and a multiple of " + std::to_string(x_stride_multiple) : "";
  STRATA_EXPECTS(r.x_stride >= cols && r.x_stride % x_stride_multiple == 0, InvalidArgument,
                 hook + " needs x_stride at least cols (" + std::to_string(cols) + ")" + multiple + ", got " +
                     std::to_string(r.x_stride));
  STRATA_EXPECTS(r.y_stride >= rows, InvalidArgument,
                 hook + " needs y_stride at least rows (" + std::to_string(rows) + "), got " +
                     std::to_string(r.y_stride));
  for (int g = 0; g < r.groups; ++g) {
    STRATA_EXPECTS(r.slots[g] < n_matrix, InvalidArgument,
                   hook + ": slots[" + std::to_string(g) + "] = " + std::to_string(r.slots[g]) +
                       " lies outside the stack of " + std::to_string(n_matrix) + " matrices");
  }
  for (int g = 0; g <= r.groups && r.groups > 0; ++g) {
    const int low = g == 0 ? 0 : r.begin[g - 1];
    STRATA_EXPECTS(r.begin[g] >= low && (g < r.groups || r.begin[g] <= r.count), InvalidArgument,
                   hook + ": begin[" + std::to_string(g) + "] = " + std::to_string(r.begin[g]) +
                       " breaks 0 <= begin[0] <= ... <= begin[groups] <= x rows (" + std::to_string(r.count) + ")");
  }
}

// A product's rows as the launch takes them, the groups uploaded.
class DeviceRows {
 public:
  explicit DeviceRows(const MatmulCheckRows& r)
      : slots_(r.groups * sizeof(std::int32_t)), begin_(r.groups > 0 ? (r.groups + 1) * sizeof(std::int32_t) : 0) {
    rows_ = kernels::MatmulRows{r.count, r.x_stride, r.y_stride};
    if (r.groups == 0) return;
    STRATA_CUDA_TRY(cudaMemcpy(slots_.as<void>(), r.slots, slots_.bytes(), cudaMemcpyHostToDevice));
    STRATA_CUDA_TRY(cudaMemcpy(begin_.as<void>(), r.begin, begin_.bytes(), cudaMemcpyHostToDevice));
    groups_ = kernels::MatmulGroups{slots_.as<int>(), begin_.as<int>(), r.groups};
  }
  const kernels::MatmulRows& rows() const noexcept { return rows_; }
  // nullptr for a dense product
  const kernels::MatmulGroups* groups() const noexcept { return groups_.count > 0 ? &groups_ : nullptr; }

 private:
  DeviceBuffer slots_, begin_;
  kernels::MatmulRows rows_;
  kernels::MatmulGroups groups_;
};

cudaError_t run_quant(const QuantForm& form, const QuantPlanes& stack, int rows, int cols, const DeviceRows& r,
                      const DeviceActivation& a, float* y) {
  const kernels::MatmulGroups* groups = r.groups();
  const std::int8_t* xq = a.xq.as<std::int8_t>();
  const float* dx = a.dx.as<float>();
  return groups == nullptr ? kernels::matmul_quant(form, stack, rows, cols, r.rows(), xq, dx, y, nullptr)
                           : kernels::matmul_quant_grouped(form, stack, rows, cols, r.rows(), *groups, xq, dx, y,
                                                           nullptr);
}

cudaError_t run_float(FloatKind kind, const void* w, int rows, int cols, const DeviceRows& r, const float* x,
                      float* y) {
  const kernels::MatmulGroups* groups = r.groups();
  return groups == nullptr ? kernels::matmul_float(kind, w, rows, cols, r.rows(), x, y, nullptr)
                           : kernels::matmul_float_grouped(kind, w, rows, cols, r.rows(), *groups, x, y, nullptr);
}

void check_quant_form(const QuantForm& form, int cols) {
  STRATA_EXPECTS(kernels::matmul_quant_supports(form), InvalidArgument,
                 "matmul_quant: the form descriptor (code_bits " + std::to_string(form.code_bits) + ", group " +
                     std::to_string(form.group_size) + ", super " + std::to_string(form.super_size) +
                     ") is none of docs/forms.md's forms");
  STRATA_EXPECTS(cols % form.super_size == 0, InvalidArgument,
                 "matmul_quant needs cols a multiple of " + std::to_string(form.super_size) + ", got " +
                     std::to_string(cols));
}

// The rows of a timed product: `groups` equal groups, group g times matrix g % n_matrix.
struct TimedGroups {
  TimedGroups(int n_matrix, int count, int groups) : slots(groups), begin(groups + 1) {
    STRATA_EXPECTS(groups >= 0 && (groups == 0 || count % groups == 0), InvalidArgument,
                   "timing needs groups >= 0 dividing the rows, got " + std::to_string(groups) + " groups of " +
                       std::to_string(count) + " rows");
    for (int g = 0; g < groups; ++g) slots[g] = g % n_matrix;
    for (int g = 0; g <= groups; ++g) begin[g] = groups > 0 ? g * (count / groups) : 0;
    rows.count = count;
    rows.slots = slots.data();
    rows.begin = begin.data();
    rows.groups = groups;
  }
  std::vector<std::int32_t> slots, begin;
  MatmulCheckRows rows;
};

}  // namespace

void matmul_quant(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                  int cols, const MatmulCheckRows& x_rows, const float* x, float* y) {
  check_quant_form(form, cols);
  check_rows("matmul_quant", n_matrix, rows, cols, x_rows, 32);
  check_device(device);
  DeviceScope scope(device);
  const DevicePlanes stack(form, host_stack, static_cast<long>(n_matrix) * rows, cols, 1);
  const long x_floats = static_cast<long>(x_rows.count) * x_rows.x_stride;
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(x_floats) * sizeof(float));
  DeviceActivation a(x_floats);
  const DeviceRows d_rows(x_rows);
  GuardedOutput d_y(static_cast<std::size_t>(x_rows.count) * x_rows.y_stride * sizeof(float));
  STRATA_CUDA_TRY(a.quantize(d_x.as<float>(), x_floats));
  STRATA_CUDA_TRY(run_quant(form, stack.at(0), rows, cols, d_rows, a, d_y.data<float>()));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "matmul_quant");
}

void matmul_float(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                  const MatmulCheckRows& x_rows, const float* x, float* y) {
  check_rows("matmul_float", n_matrix, rows, cols, x_rows, 1);
  check_device(device);
  DeviceScope scope(device);
  const std::size_t stack_bytes = static_cast<std::size_t>(n_matrix) * rows * cols * float_kind_bytes(kind);
  DeviceBuffer d_w = upload(w_stack, stack_bytes);
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(x_rows.count) * x_rows.x_stride * sizeof(float));
  const DeviceRows d_rows(x_rows);
  GuardedOutput d_y(static_cast<std::size_t>(x_rows.count) * x_rows.y_stride * sizeof(float));
  STRATA_CUDA_TRY(run_float(kind, d_w.as<void>(), rows, cols, d_rows, d_x.as<float>(), d_y.data<float>()));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "matmul_float");
}

double time_matmul_quant(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                         int cols, int count, int groups, int reps) {
  check_quant_form(form, cols);
  TimedGroups timed(n_matrix, count, groups);
  timed.rows.x_stride = cols, timed.rows.y_stride = rows;
  check_rows("time_matmul_quant", n_matrix, rows, cols, timed.rows, 32);
  check_device(device);
  DeviceScope scope(device);
  const DevicePlanes stack(form, host_stack, static_cast<long>(n_matrix) * rows, cols, 1);
  const long x_floats = static_cast<long>(count) * cols;
  DeviceActivation a(x_floats);
  STRATA_CUDA_TRY(cudaMemset(a.xq.as<void>(), 1, a.xq.bytes()));
  STRATA_CUDA_TRY(cudaMemset(a.dx.as<void>(), 0, a.dx.bytes()));
  const DeviceRows d_rows(timed.rows);
  DeviceBuffer d_y(static_cast<std::size_t>(count) * rows * sizeof(float));
  return median_launch_seconds(1, reps, [&](int) {
    return run_quant(form, stack.at(0), rows, cols, d_rows, a, d_y.as<float>());
  });
}

double time_matmul_float(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                         int count, int groups, int reps) {
  TimedGroups timed(n_matrix, count, groups);
  timed.rows.x_stride = cols, timed.rows.y_stride = rows;
  check_rows("time_matmul_float", n_matrix, rows, cols, timed.rows, 1);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_w = upload(w_stack, static_cast<std::size_t>(n_matrix) * rows * cols * float_kind_bytes(kind));
  DeviceBuffer d_x(static_cast<std::size_t>(count) * cols * sizeof(float));
  STRATA_CUDA_TRY(cudaMemset(d_x.as<void>(), 0, d_x.bytes()));
  const DeviceRows d_rows(timed.rows);
  DeviceBuffer d_y(static_cast<std::size_t>(count) * rows * sizeof(float));
  return median_launch_seconds(1, reps, [&](int) {
    return run_float(kind, d_w.as<void>(), rows, cols, d_rows, d_x.as<float>(), d_y.as<float>());
  });
}

}  // namespace strata::kernel_check
