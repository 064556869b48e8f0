// kernel_check entries of the hyper-connection mixer: the whole read of one token chained on the device from
// the grouped RMSNorm, q8_32, GEMV and hc.cuh kernels (the decode step's fallback and the prompt path's order),
// the same read fused in two launches (hc_read.cuh, the decode step's), and the mix and the write-back alone
// over rows of tokens.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/gemv.cuh"
#include "../kernels/hc.cuh"
#include "../kernels/hc_read.cuh"
#include "../kernels/norm.cuh"
#include "../kernels/quantize.cuh"
#include "../session/products/projection.hpp"
#include "kernel_check_support.hpp"
#include "strata/device_weights.hpp"
#include "strata/check/kernel_check.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

std::size_t floats(long n) { return static_cast<std::size_t>(n) * sizeof(float); }

void check_sizes(const char* kernel, int rows, int streams, int n) {
  STRATA_EXPECTS(rows > 0 && streams > 0 && n > 0, InvalidArgument,
                 std::string(kernel) + " needs rows, streams and n > 0, got " + std::to_string(rows) + " x " +
                     std::to_string(streams) + " x " + std::to_string(n));
}

void check_shape(const HostTensor& t, const char* role, long rows, long cols) {
  STRATA_EXPECTS(t.rows == rows && t.cols == cols, InvalidArgument,
                 "hc_read: the " + std::string(role) + " weight " + t.name + " is " + std::to_string(t.rows) +
                     " x " + std::to_string(t.cols) + ", expected " + std::to_string(rows) + " x " +
                     std::to_string(cols));
  STRATA_EXPECTS(t.is_float || (cols % kernels::kQ8Block == 0 && kernels::gemv_quant_supports(t.form)),
                 InvalidArgument,
                 "hc_read: the " + std::string(role) + " weight " + t.name +
                     " has a quantized form the GEMV lacks, or " + std::to_string(cols) +
                     " columns that are no multiple of 32");
}

// y = W x on the device as the decode step runs it: quantized forms quantize x to q8_32 first (into buffers
// sized for the widest input), float forms take x as it is.
class DeviceGemv {
 public:
  explicit DeviceGemv(long max_cols)
      : xq_(static_cast<std::size_t>(max_cols)),
        dx_(floats(max_cols / kernels::kQ8Block)),
        sums_(static_cast<std::size_t>(max_cols / kernels::kQ8Block) * sizeof(std::int32_t)) {}

  void operator()(const DeviceTensor& w, const float* x, float* y) const {
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    if (w.is_float) {
      STRATA_CUDA_TRY(kernels::gemv_float(w.float_kind, w.data, rows, cols, x, y, nullptr));
      return;
    }
    STRATA_CUDA_TRY(kernels::quantize_q8_32(x, xq_.as<std::int8_t>(), dx_.as<float>(), sums_.as<std::int32_t>(),
                                            cols, nullptr));
    STRATA_CUDA_TRY(kernels::gemv_quant(w.form, w.planes, rows, cols, xq_.as<std::int8_t>(), dx_.as<float>(),
                                        sums_.as<std::int32_t>(), y, nullptr));
  }

 private:
  DeviceBuffer xq_, dx_, sums_;
};

// The read's weights checked against its shape (streams, n) and gathered for the upload; returns the rank.
long read_weights(int streams, int n, const HostTensor& down, const HostTensor& up, const HostTensor* inject,
                  std::vector<HostTensor>& host) {
  STRATA_EXPECTS(streams > 0 && n > 0, InvalidArgument,
                 "hc_read needs streams > 0 and n > 0, got " + std::to_string(streams) + " x " + std::to_string(n));
  const long width = static_cast<long>(streams) * n;
  const long rank = down.rows;
  STRATA_EXPECTS(rank > 0 && rank % kernels::kQ8Block == 0, InvalidArgument,
                 "hc_read: the down weight " + down.name + " has " + std::to_string(rank) +
                     " rows, expected a positive multiple of 32 (the rank is the up GEMV's q8_32 input)");
  check_shape(down, "down", rank, width);
  check_shape(up, "up", width, rank);
  host = {down, up};
  if (inject != nullptr) {
    check_shape(*inject, "inject", streams, width);
    host.push_back(*inject);
  }
  return rank;
}

}  // namespace

void hc_read(int device, const float* h, const float* norm, int streams, int n, float eps, const HostTensor& down,
             const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out) {
  std::vector<HostTensor> host;
  const long rank = read_weights(streams, n, down, up, inject, host);
  const long width = static_cast<long>(streams) * n;
  check_device(device);
  DeviceScope scope(device);
  const DeviceWeights weights(device, host);
  const DeviceGemv gemv(width);
  DeviceBuffer d_h = upload(h, floats(width));
  DeviceBuffer d_norm = upload(norm, floats(width));
  DeviceBuffer d_down_out(floats(rank)), d_up_out(floats(width)), d_inject_out(floats(streams));
  GuardedOutput d_normed(floats(width)), d_low(floats(rank)), d_x(floats(n)), d_inj(floats(streams));
  const float per_stream = 1.0f / static_cast<float>(streams);

  STRATA_CUDA_TRY(kernels::rms_norm_grouped(d_h.as<float>(), d_norm.as<float>(), d_normed.data<float>(), 1, streams,
                                            n, eps, nullptr));
  gemv(weights.get(down.name), d_normed.data<float>(), d_down_out.as<float>());
  STRATA_CUDA_TRY(kernels::scaled_activation(d_down_out.as<float>(), d_low.data<float>(), static_cast<int>(rank),
                                             kernels::Activation::Silu, per_stream, 1.0f, nullptr));
  gemv(weights.get(up.name), d_low.data<float>(), d_up_out.as<float>());
  STRATA_CUDA_TRY(kernels::hc_mix(d_up_out.as<float>(), d_normed.data<float>(), d_x.data<float>(), 1, streams, n,
                                  nullptr));
  if (inject != nullptr) {
    gemv(weights.get(inject->name), d_normed.data<float>(), d_inject_out.as<float>());
    STRATA_CUDA_TRY(kernels::scaled_activation(d_inject_out.as<float>(), d_inj.data<float>(), streams,
                                               kernels::Activation::Sigmoid, per_stream, 2.0f, nullptr));
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_normed.copy_out(out.normed, "hc_read (grouped rms_norm)");
  d_low.copy_out(out.low, "hc_read (low-rank silu)");
  d_x.copy_out(out.x, "hc_mix");
  if (inject != nullptr) d_inj.copy_out(out.inj, "hc_read (inject sigmoid)");
}

void hc_read_fused(int device, const float* h, const float* norm, int streams, int n, float eps,
                   const HostTensor& down, const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out) {
  std::vector<HostTensor> host;
  const int rank = static_cast<int>(read_weights(streams, n, down, up, inject, host));
  const long width = static_cast<long>(streams) * n;
  check_device(device);
  DeviceScope scope(device);
  const DeviceWeights weights(device, host);
  const kernels::HcReadShape shape{streams, n, rank, eps};
  const kernels::WeightMatrix w_down = weight_matrix(weights.get(down.name));
  const kernels::WeightMatrix w_up = weight_matrix(weights.get(up.name));
  const kernels::WeightMatrix w_inject = inject ? weight_matrix(weights.get(inject->name)) : kernels::WeightMatrix{};
  const kernels::WeightMatrix* p_inject = inject ? &w_inject : nullptr;
  STRATA_EXPECTS(kernels::hc_read_fusable(shape, w_down, w_up, p_inject), InvalidArgument,
                 "hc_read_fused: the fused read takes no " + std::to_string(streams) + " x " + std::to_string(n) +
                     " streams of rank " + std::to_string(rank) + " with these forms of " + down.name + ", " +
                     up.name + (inject ? ", " + inject->name : std::string()) +
                     " (n and the rank multiples of 32, streams dividing 32, forms the GEMVs read, an activation "
                     "in 43 KB of shared memory)");
  DeviceBuffer d_h = upload(h, floats(width));
  DeviceBuffer d_norm = upload(norm, floats(width));
  GuardedOutput d_rms(floats(streams)), d_low(floats(rank)), d_inj(floats(streams)), d_x(floats(n));
  const GuardedQ8 d_x_q8(out.x_q8, n);
  DeviceBuffer d_hn(floats(width)), d_hn_q(width), d_hn_dx(floats(width / 32)), d_hn_sums(width / 32 * 4);
  const kernels::HcReadStage stage{d_hn.as<float>(), {d_hn_q.as<std::int8_t>(), d_hn_dx.as<float>(),
                                                      d_hn_sums.as<std::int32_t>()}};
  STRATA_CUDA_TRY(kernels::hc_read_down(shape, d_h.as<float>(), d_norm.as<float>(), w_down, p_inject, stage,
                                        d_low.data<float>(), inject ? d_inj.data<float>() : nullptr,
                                        d_rms.data<float>(), nullptr));
  STRATA_CUDA_TRY(kernels::hc_read_up_mix(shape, d_h.as<float>(), d_norm.as<float>(), d_rms.data<float>(),
                                          d_low.data<float>(), w_up, d_x.data<float>(), d_x_q8.blocks(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_rms.copy_out(out.rms, "hc_read_down (rms)");
  d_low.copy_out(out.low, "hc_read_down (low)");
  if (inject != nullptr) d_inj.copy_out(out.inj, "hc_read_down (inj)");
  d_x.copy_out(out.x, "hc_read_up_mix (x)");
  d_x_q8.copy_out(0, "hc_read_up_mix (x's q8_32 form)");
}

void hc_mix(int device, const float* up, const float* normed, float* x, int rows, int streams, int n) {
  check_sizes("hc_mix", rows, streams, n);
  check_device(device);
  DeviceScope scope(device);
  const long width = static_cast<long>(rows) * streams * n;
  DeviceBuffer d_up = upload(up, floats(width));
  DeviceBuffer d_normed = upload(normed, floats(width));
  GuardedOutput d_x(floats(static_cast<long>(rows) * n));
  STRATA_CUDA_TRY(kernels::hc_mix(d_up.as<float>(), d_normed.as<float>(), d_x.data<float>(), rows, streams, n,
                                  nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_x.copy_out(x, "hc_mix");
}

namespace {

// hc_write's round trip for both hooks: `addend(vectors, table)` makes the write's addend, uploading what it points
// to into the two buffers (which live until the write has run).
template <class Addend>
void write_round_trip(const char* hook, int device, const float* h, const float* inj, int inj_stride, const float* y,
                      float* h_out, int rows, int streams, int n, Addend addend) {
  check_sizes(hook, rows, streams, n);
  STRATA_EXPECTS(inj_stride >= 0, InvalidArgument,
                 std::string(hook) + " needs inj_stride >= 0, got " + std::to_string(inj_stride));
  check_device(device);
  DeviceScope scope(device);
  const long width = static_cast<long>(rows) * streams * n;
  DeviceBuffer d_inj = upload(inj, floats(static_cast<long>(rows - 1) * inj_stride + streams));
  DeviceBuffer d_y = upload(y, floats(static_cast<long>(rows) * n));
  GuardedOutput d_h(floats(width));
  STRATA_CUDA_TRY(cudaMemcpy(d_h.data<float>(), h, floats(width), cudaMemcpyHostToDevice));  // it works in place
  DeviceBuffer d_vectors(0), d_table(0);
  const kernels::StreamAddend add = addend(d_vectors, d_table);
  STRATA_CUDA_TRY(kernels::hc_write(d_h.data<float>(), d_inj.as<float>(), inj_stride, d_y.as<float>(), rows, streams,
                                    n, nullptr, add));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_h.copy_out(h_out, hook);
}

}  // namespace

void hc_write(int device, const float* h, const float* inj, int inj_stride, const float* y, float* h_out, int rows,
              int streams, int n) {
  write_round_trip("hc_write", device, h, inj, inj_stride, y, h_out, rows, streams, n,
                   [](DeviceBuffer&, DeviceBuffer&) { return kernels::StreamAddend{}; });
}

void hc_write_steered(int device, const float* h, const float* inj, int inj_stride, const float* y,
                      const float* vectors, const std::uint8_t* row_has, bool per_row, float* h_out, int rows,
                      int streams, int n) {
  write_round_trip("hc_write_steered", device, h, inj, inj_stride, y, h_out, rows, streams, n,
                   [&](DeviceBuffer& d_vectors, DeviceBuffer& d_table) {
    kernels::StreamAddend add;
    if (!per_row) {
      d_vectors = upload(vectors, floats(n));
      add.vector = d_vectors.as<float>();
      return add;
    }
    // Each row's vector is the second of two rows of its own table, as a layer's is row `layer` of a sequence's: the
    // kernel reads it `offset` floats in.
    std::vector<float> tables(static_cast<std::size_t>(rows) * 2 * n, 0.0f);
    for (int r = 0; r < rows; ++r) {
      std::copy(vectors + static_cast<long>(r) * n, vectors + static_cast<long>(r + 1) * n,
                tables.begin() + (2L * r + 1) * n);
    }
    d_vectors = upload(tables.data(), floats(static_cast<long>(tables.size())));
    std::vector<const float*> pointers(rows, nullptr);
    for (int r = 0; r < rows; ++r) {
      if (row_has[r]) pointers[r] = d_vectors.as<float>() + 2L * r * n;
    }
    d_table = upload(pointers.data(), sizeof(const float*) * rows);
    add.rows = d_table.as<const float*>();
    add.offset = n;
    return add;
  });
}

void hc_stream_mean(int device, const float* h, float* out, int streams, int n) {
  check_sizes("hc_stream_mean", 1, streams, n);
  check_device(device);
  DeviceScope scope(device);
  DeviceBuffer d_h = upload(h, floats(static_cast<long>(streams) * n));
  GuardedOutput d_out(floats(n));
  STRATA_CUDA_TRY(kernels::hc_stream_mean(d_h.as<float>(), streams, n, d_out.data<float>(), nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "hc_stream_mean");
}

}  // namespace strata::kernel_check
