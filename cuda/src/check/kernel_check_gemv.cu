// kernel_check entries of the GEMV family: q8_32 activation quantization, quantized and float GEMV (one matrix
// or a batch over a stack), and their cold-L2 timing for benchmarks/bench_gemv.py.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/gemv.cuh"
#include "../kernels/gemv_quant_mma.cuh"
#include "../kernels/quantize.cuh"
#include "kernel_check_quant.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

constexpr std::size_t kColdBytes = std::size_t{512} << 20;  // well above any GPU's L2 cache
constexpr int kMaxCopies = 4096;

// The multi-input GEMV's kernel of a hook's `kernel` argument (kernel_check.hpp), checked against the form.
kernels::InputsKernel inputs_kernel(int kernel, const QuantForm& form, int rows, int cols) {
  STRATA_EXPECTS(kernel >= 0 && kernel <= 2, InvalidArgument,
                 "gemv_quant_inputs: kernel " + std::to_string(kernel) +
                     " is none of 0 (chosen), 1 (integer), 2 (tensor cores)");
  STRATA_EXPECTS(kernel != 2 || kernels::gemv_quant_mma_takes(form, cols), InvalidArgument,
                 "gemv_quant_inputs: the tensor-core kernel takes Q8_0, Q5_0 and Q4_0 at an even count of 32-element "
                 "blocks a row; not this form at " + std::to_string(cols) + " columns");
  STRATA_EXPECTS(kernel != 2 || kernels::gemv_quant_mma_runs(form, rows, cols), InvalidArgument,
                 "gemv_quant_inputs: the tensor-core kernel splits a matrix of " + std::to_string(rows) +
                     " rows over a thread block cluster, which this device does not have (compute capability 9.0)");
  return kernel == 0 ? kernels::InputsKernel::kChosen
                     : kernel == 1 ? kernels::InputsKernel::kInteger : kernels::InputsKernel::kTensorCores;
}

void check_quant_shape(const QuantForm& form, int rows, int cols) {
  STRATA_EXPECTS(kernels::gemv_quant_supports(form), InvalidArgument,
                 "gemv_quant: the form descriptor (code_bits " + std::to_string(form.code_bits) + ", group " +
                     std::to_string(form.group_size) + ", super " + std::to_string(form.super_size) +
                     ") is none of docs/forms.md's forms");
  STRATA_EXPECTS(rows > 0 && cols > 0 && cols % form.super_size == 0, InvalidArgument,
                 "gemv_quant needs rows > 0 and cols a positive multiple of " + std::to_string(form.super_size) +
                     ", got " + std::to_string(rows) + " x " + std::to_string(cols));
}

void check_float_shape(const char* hook, int rows, int cols) {
  STRATA_EXPECTS(rows > 0 && cols > 0, InvalidArgument,
                 std::string(hook) + " needs rows > 0 and cols > 0, got " + std::to_string(rows) + " x " +
                     std::to_string(cols));
}

// Checks a batch's arguments (before any device work) and returns how many floats x holds.
long checked_batch_x(const char* hook, int n_matrix, int cols, const std::int32_t* slots, int count, int x_stride,
                     int stride_multiple) {
  const std::string name(hook);
  STRATA_EXPECTS(count >= 1 && count <= kernels::kMaxBatchProducts, InvalidArgument,
                 name + " needs 1 <= count <= " + std::to_string(kernels::kMaxBatchProducts) + " products, got " +
                     std::to_string(count));
  STRATA_EXPECTS(n_matrix >= 1, InvalidArgument,
                 name + " needs a stack of at least one matrix, got " + std::to_string(n_matrix));
  const std::string multiple = stride_multiple > 1 ? " and a multiple of " + std::to_string(stride_multiple) : "";
  STRATA_EXPECTS(x_stride == 0 || (x_stride >= cols && x_stride % stride_multiple == 0), InvalidArgument,
                 name + " needs x_stride 0 or at least cols (" + std::to_string(cols) + ")" + multiple + ", got " +
                     std::to_string(x_stride));
  for (int j = 0; j < count; ++j) {
    STRATA_EXPECTS(slots[j] < n_matrix, InvalidArgument,
                   name + ": slots[" + std::to_string(j) + "] = " + std::to_string(slots[j]) +
                       " lies outside the stack of " + std::to_string(n_matrix) + " matrices");
  }
  return x_stride == 0 ? cols : static_cast<long>(count) * x_stride;
}

// A batch's forced row split (kernels::MatrixBatch::split): 0 (the kernels' rule), 1, 2 or 4 warps a row.
void check_split(const char* hook, int split) {
  STRATA_EXPECTS(split == 0 || split == 1 || split == 2 || split == 4, InvalidArgument,
                 std::string(hook) + " needs split 0 (the rule), 1, 2 or 4, got " + std::to_string(split));
}

// An activation of n constant codes: what the timed GEMVs read (its values do not change the time).
DeviceActivation timing_activation(long n) {
  DeviceActivation a(n);
  STRATA_CUDA_TRY(cudaMemset(a.xq.as<void>(), 1, a.xq.bytes()));
  STRATA_CUDA_TRY(cudaMemset(a.dx.as<void>(), 0, a.dx.bytes()));
  STRATA_CUDA_TRY(cudaMemset(a.sums.as<void>(), 0, a.sums.bytes()));
  return a;
}

std::size_t batch_y_bytes(int count, int rows) { return static_cast<std::size_t>(count) * rows * sizeof(float); }

int cold_copies(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>(kColdBytes / std::max<std::size_t>(bytes, 1) + 1, 1, kMaxCopies));
}

}  // namespace

void quantize_q8_32(int device, const float* x, long n, std::int8_t* xq, float* dx, std::int32_t* sums) {
  STRATA_EXPECTS(n > 0 && n % 32 == 0, InvalidArgument,
                 "quantize_q8_32 needs n a positive multiple of 32, got " + std::to_string(n));
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_x = upload(x, n * sizeof(float));
  GuardedOutput d_xq(n), d_dx(n / 32 * sizeof(float)), d_sums(n / 32 * sizeof(std::int32_t));
  STRATA_CUDA_TRY(kernels::quantize_q8_32(d_x.as<float>(), d_xq.data<std::int8_t>(), d_dx.data<float>(),
                                          d_sums.data<std::int32_t>(), n, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_xq.copy_out(xq, "quantize_q8_32 (xq)");
  d_dx.copy_out(dx, "quantize_q8_32 (dx)");
  d_sums.copy_out(sums, "quantize_q8_32 (sums)");
}

void gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                const float* x, float* y) {
  check_quant_shape(form, rows, cols);
  check_device(device);
  DeviceScope scope(device);
  const DevicePlanes planes(form, host_planes, rows, cols, 1);
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(cols) * sizeof(float));
  DeviceActivation a(cols);
  GuardedOutput d_y(static_cast<std::size_t>(rows) * sizeof(float));
  STRATA_CUDA_TRY(a.quantize(d_x.as<float>(), cols));
  STRATA_CUDA_TRY(kernels::gemv_quant(form, planes.at(0), rows, cols, a.xq.as<std::int8_t>(), a.dx.as<float>(),
                                      a.sums.as<std::int32_t>(), d_y.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_quant");
}

void gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, const float* x, float* y) {
  check_float_shape("gemv_float", rows, cols);
  check_device(device);
  DeviceScope scope(device);
  const std::size_t element = float_kind_bytes(kind);
  DeviceBuffer d_w = upload(w, static_cast<std::size_t>(rows) * cols * element);
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(cols) * sizeof(float));
  GuardedOutput d_y(static_cast<std::size_t>(rows) * sizeof(float));
  STRATA_CUDA_TRY(kernels::gemv_float(kind, d_w.as<void>(), rows, cols, d_x.as<float>(), d_y.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_float");
}

void gemv_quant_batch(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                      int cols, const std::int32_t* slots, int count, int x_stride, const float* x, float* y,
                      int split) {
  check_quant_shape(form, rows, cols);
  check_split("gemv_quant_batch", split);
  const long x_floats = checked_batch_x("gemv_quant_batch", n_matrix, cols, slots, count, x_stride, 32);
  check_device(device);
  DeviceScope scope(device);
  const DevicePlanes stack(form, host_stack, static_cast<long>(n_matrix) * rows, cols, 1);
  DeviceBuffer d_slots = upload(slots, static_cast<std::size_t>(count) * sizeof(std::int32_t));
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(x_floats) * sizeof(float));
  DeviceActivation a(x_floats);
  GuardedOutput d_y(batch_y_bytes(count, rows));
  STRATA_CUDA_TRY(a.quantize(d_x.as<float>(), x_floats));
  const kernels::MatrixBatch batch{d_slots.as<int>(), count, x_stride, split};
  STRATA_CUDA_TRY(kernels::gemv_quant_batch(form, stack.at(0), rows, cols, batch, a.xq.as<std::int8_t>(),
                                            a.dx.as<float>(), a.sums.as<std::int32_t>(), d_y.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_quant_batch");
}

void gemv_quant_inputs(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                       int inputs, int x_stride, const float* x, float* y, int kernel) {
  check_quant_shape(form, rows, cols);
  const kernels::InputsKernel chosen = inputs_kernel(kernel, form, rows, cols);
  const int max_inputs = kernels::gemv_quant_max_inputs(form, rows, cols, chosen);
  STRATA_EXPECTS(inputs >= 1 && inputs <= max_inputs, InvalidArgument,
                 "gemv_quant_inputs needs 1 <= inputs <= " + std::to_string(max_inputs) + ", got " +
                     std::to_string(inputs));
  STRATA_EXPECTS(x_stride >= cols && x_stride % 32 == 0, InvalidArgument,
                 "gemv_quant_inputs needs x_stride at least cols (" + std::to_string(cols) +
                     ") and a multiple of 32, got " + std::to_string(x_stride));
  check_device(device);
  DeviceScope scope(device);
  const DevicePlanes planes(form, host_planes, rows, cols, 1);
  const long x_floats = static_cast<long>(inputs) * x_stride;
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(x_floats) * sizeof(float));
  DeviceActivation a(x_floats);
  GuardedOutput d_y(batch_y_bytes(inputs, rows));
  STRATA_CUDA_TRY(a.quantize(d_x.as<float>(), x_floats));
  STRATA_CUDA_TRY(kernels::gemv_quant_inputs(form, planes.at(0), rows, cols, inputs, x_stride, a.xq.as<std::int8_t>(),
                                             a.dx.as<float>(), a.sums.as<std::int32_t>(), d_y.data<float>(), nullptr,
                                             chosen));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_quant_inputs");
}

void gemv_float_inputs(int device, FloatKind kind, const void* w, int rows, int cols, int inputs, int x_stride,
                       const float* x, float* y) {
  check_float_shape("gemv_float_inputs", rows, cols);
  STRATA_EXPECTS(inputs >= 1 && inputs <= kernels::kMaxFloatInputs, InvalidArgument,
                 "gemv_float_inputs needs 1 <= inputs <= " + std::to_string(kernels::kMaxFloatInputs) + ", got " +
                     std::to_string(inputs));
  STRATA_EXPECTS(x_stride >= cols, InvalidArgument,
                 "gemv_float_inputs needs x_stride at least cols (" + std::to_string(cols) + "), got " +
                     std::to_string(x_stride));
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_w = upload(w, static_cast<std::size_t>(rows) * cols * float_kind_bytes(kind));
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(inputs) * x_stride * sizeof(float));
  GuardedOutput d_y(batch_y_bytes(inputs, rows));
  STRATA_CUDA_TRY(kernels::gemv_float_inputs(kind, d_w.as<void>(), rows, cols, inputs, x_stride, d_x.as<float>(),
                                             d_y.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_float_inputs");
}

void gemv_float_batch(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                      const std::int32_t* slots, int count, int x_stride, const float* x, float* y) {
  check_float_shape("gemv_float_batch", rows, cols);
  const long x_floats = checked_batch_x("gemv_float_batch", n_matrix, cols, slots, count, x_stride, 1);
  check_device(device);
  DeviceScope scope(device);
  const std::size_t stack_bytes = static_cast<std::size_t>(n_matrix) * rows * cols * float_kind_bytes(kind);
  DeviceBuffer d_w = upload(w_stack, stack_bytes);
  DeviceBuffer d_slots = upload(slots, static_cast<std::size_t>(count) * sizeof(std::int32_t));
  DeviceBuffer d_x = upload(x, static_cast<std::size_t>(x_floats) * sizeof(float));
  GuardedOutput d_y(batch_y_bytes(count, rows));
  const kernels::MatrixBatch batch{d_slots.as<int>(), count, x_stride};
  STRATA_CUDA_TRY(kernels::gemv_float_batch(kind, d_w.as<void>(), rows, cols, batch, d_x.as<float>(),
                                            d_y.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_y.copy_out(y, "gemv_float_batch");
}

namespace {

// The cold-L2 timing of gemv_quant_batch (decode_once false; a single product of matrix 0 for one input) or
// gemv_quant_inputs over `inputs` rows of `a`.
double time_quant_inputs(const QuantForm& form, const DevicePlanes& planes, int copies, int rows, int cols,
                         int inputs, bool decode_once, const DeviceActivation& a, const DeviceBuffer& slots,
                         const DeviceBuffer& y, int reps,
                         kernels::InputsKernel kernel = kernels::InputsKernel::kChosen) {
  return median_launch_seconds(copies, reps, [&](int copy) {
    const std::int8_t* xq = a.xq.as<std::int8_t>();
    if (decode_once) {
      return kernels::gemv_quant_inputs(form, planes.at(copy), rows, cols, inputs, cols, xq, a.dx.as<float>(),
                                        a.sums.as<std::int32_t>(), y.as<float>(), nullptr, kernel);
    }
    const kernels::MatrixBatch batch{inputs > 1 ? slots.as<int>() : nullptr, inputs, inputs > 1 ? cols : 0};
    return kernels::gemv_quant_batch(form, planes.at(copy), rows, cols, batch, xq, a.dx.as<float>(),
                                     a.sums.as<std::int32_t>(), y.as<float>(), nullptr);
  });
}

}  // namespace

void time_gemv_quant_inputs(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                            int max_inputs, int reps, double* batch_seconds, double* inputs_seconds, int kernel) {
  check_quant_shape(form, rows, cols);
  const kernels::InputsKernel chosen = inputs_kernel(kernel, form, rows, cols);
  const int bound = kernels::gemv_quant_max_inputs(form, rows, cols, chosen);
  STRATA_EXPECTS(max_inputs >= 1 && max_inputs <= bound, InvalidArgument,
                 "time_gemv_quant_inputs needs 1 <= max_inputs <= " + std::to_string(bound) +
                     ", got " + std::to_string(max_inputs));
  check_device(device);
  DeviceScope scope(device);
  const int copies = cold_copies(plane_bytes(form, rows, cols).total());
  const DevicePlanes planes(form, host_planes, rows, cols, copies);
  const DeviceActivation a = timing_activation(static_cast<long>(max_inputs) * cols);
  DeviceBuffer y(batch_y_bytes(max_inputs, rows));
  DeviceBuffer slots(static_cast<std::size_t>(max_inputs) * sizeof(int));
  STRATA_CUDA_TRY(cudaMemset(slots.as<void>(), 0, slots.bytes()));  // every product reads matrix 0
  for (int inputs = 1; inputs <= max_inputs; ++inputs) {
    batch_seconds[inputs - 1] = time_quant_inputs(form, planes, copies, rows, cols, inputs, false, a, slots, y, reps);
    inputs_seconds[inputs - 1] =
        time_quant_inputs(form, planes, copies, rows, cols, inputs, true, a, slots, y, reps, chosen);
  }
}

double time_gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                       int reps) {
  check_quant_shape(form, rows, cols);
  check_device(device);
  DeviceScope scope(device);
  const int copies = cold_copies(plane_bytes(form, rows, cols).total());
  const DevicePlanes planes(form, host_planes, rows, cols, copies);
  const DeviceActivation a = timing_activation(cols);
  DeviceBuffer y(static_cast<std::size_t>(rows) * sizeof(float));
  const DeviceBuffer no_slots(0);  // one product of matrix 0
  return time_quant_inputs(form, planes, copies, rows, cols, 1, false, a, no_slots, y, reps);
}

double time_gemv_quant_batch(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                             int cols, int count, int split, int reps) {
  check_quant_shape(form, rows, cols);
  STRATA_EXPECTS(n_matrix >= 1 && count >= 1 && count <= kernels::kMaxBatchProducts, InvalidArgument,
                 "time_gemv_quant_batch needs a stack of at least one matrix and 1 <= count <= " +
                     std::to_string(kernels::kMaxBatchProducts) + ", got " + std::to_string(n_matrix) + " and " +
                     std::to_string(count));
  check_split("time_gemv_quant_batch", split);
  check_device(device);
  DeviceScope scope(device);
  const long stack_rows = static_cast<long>(n_matrix) * rows;
  const int copies = cold_copies(plane_bytes(form, stack_rows, cols).total());
  const DevicePlanes stack(form, host_stack, stack_rows, cols, copies);
  std::vector<int> slots(count);
  for (int j = 0; j < count; ++j) slots[j] = j % n_matrix;
  DeviceBuffer d_slots = upload(slots.data(), slots.size() * sizeof(int));
  const DeviceActivation a = timing_activation(static_cast<long>(count) * cols);
  DeviceBuffer y(batch_y_bytes(count, rows));
  const kernels::MatrixBatch batch{d_slots.as<int>(), count, cols, split};
  return median_launch_seconds(copies, reps, [&](int copy) {
    return kernels::gemv_quant_batch(form, stack.at(copy), rows, cols, batch, a.xq.as<std::int8_t>(), a.dx.as<float>(),
                                     a.sums.as<std::int32_t>(), y.as<float>(), nullptr);
  });
}

namespace {

// Enough device copies of a float weight to overflow the L2 cache, `stride` bytes apart.
struct FloatCopies {
  FloatCopies(FloatKind kind, const void* host, int rows, int cols)
      : bytes(static_cast<std::size_t>(rows) * cols * float_kind_bytes(kind)),
        copies(cold_copies(bytes)),
        stride(aligned(bytes)),
        w(stride * copies) {
    for (int c = 0; c < copies; ++c) {
      STRATA_CUDA_TRY(cudaMemcpy(w.as<unsigned char>() + stride * c, host, bytes, cudaMemcpyHostToDevice));
    }
  }
  const void* at(int copy) const { return w.as<unsigned char>() + stride * copy; }
  std::size_t bytes;
  int copies;
  std::size_t stride;
  DeviceBuffer w;
};

DeviceBuffer zero_floats(std::size_t count) {
  DeviceBuffer d(count * sizeof(float));
  STRATA_CUDA_TRY(cudaMemset(d.as<void>(), 0, d.bytes()));
  return d;
}

}  // namespace

double time_gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, int reps) {
  check_float_shape("time_gemv_float", rows, cols);
  check_device(device);
  DeviceScope scope(device);
  const FloatCopies weights(kind, w, rows, cols);
  const DeviceBuffer d_x = zero_floats(cols);
  DeviceBuffer d_y(static_cast<std::size_t>(rows) * sizeof(float));
  return median_launch_seconds(weights.copies, reps, [&](int copy) {
    return kernels::gemv_float(kind, weights.at(copy), rows, cols, d_x.as<float>(), d_y.as<float>(), nullptr);
  });
}

void time_gemv_float_inputs(int device, FloatKind kind, const void* w, int rows, int cols, int max_inputs, int reps,
                            double* batch_seconds, double* inputs_seconds) {
  check_float_shape("time_gemv_float_inputs", rows, cols);
  STRATA_EXPECTS(max_inputs >= 1 && max_inputs <= kernels::kMaxFloatInputs, InvalidArgument,
                 "time_gemv_float_inputs needs 1 <= max_inputs <= " + std::to_string(kernels::kMaxFloatInputs) +
                     ", got " + std::to_string(max_inputs));
  check_device(device);
  DeviceScope scope(device);
  const FloatCopies weights(kind, w, rows, cols);
  const DeviceBuffer d_x = zero_floats(static_cast<std::size_t>(max_inputs) * cols);
  DeviceBuffer d_y(batch_y_bytes(max_inputs, rows));
  DeviceBuffer slots(static_cast<std::size_t>(max_inputs) * sizeof(int));
  STRATA_CUDA_TRY(cudaMemset(slots.as<void>(), 0, slots.bytes()));  // every product reads matrix 0
  for (int inputs = 1; inputs <= max_inputs; ++inputs) {
    const kernels::MatrixBatch batch{inputs > 1 ? slots.as<int>() : nullptr, inputs, inputs > 1 ? cols : 0};
    batch_seconds[inputs - 1] = median_launch_seconds(weights.copies, reps, [&](int copy) {
      return kernels::gemv_float_batch(kind, weights.at(copy), rows, cols, batch, d_x.as<float>(), d_y.as<float>(),
                                       nullptr);
    });
    inputs_seconds[inputs - 1] = median_launch_seconds(weights.copies, reps, [&](int copy) {
      return kernels::gemv_float_inputs(kind, weights.at(copy), rows, cols, inputs, cols, d_x.as<float>(),
                                        d_y.as<float>(), nullptr);
    });
  }
}

}  // namespace strata::kernel_check
