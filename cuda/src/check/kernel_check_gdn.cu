// kernel_check round trip of the GDN chunk (kernels/gdn_chunk.cuh), its inputs laid out as a prompt chunk has
// them and the launch captured into a CUDA graph, as the prompt program will run it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/gdn_chunk.cuh"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_mixers.hpp"

namespace strata::kernel_check {
namespace {

using support::GuardedOutput;
using support::upload;

constexpr std::uint32_t kPoisonFloat = 0xFFFFFFFFu;  // a float of kPoison bytes

DeviceBuffer poisoned(std::size_t floats) {
  DeviceBuffer buffer(floats * sizeof(float));
  if (floats > 0) STRATA_CUDA_TRY(cudaMemset(buffer.as<void>(), support::kPoison, buffer.bytes()));
  return buffer;
}

// Host rows [rows][width] into device rows `stride` floats apart.
void copy_rows_in(float* device_rows, int stride, const float* host, int rows, int width) {
  STRATA_CUDA_TRY(cudaMemcpy2D(device_rows, stride * sizeof(float), host, width * sizeof(float),
                               width * sizeof(float), rows, cudaMemcpyHostToDevice));
}

// Rows [rows][width] out of a guarded output of rows `stride` floats apart; the floats between the rows must
// still hold the poison.
void copy_rows_out(const GuardedOutput& device_rows, int stride, float* host, int rows, int width,
                   const std::string& what) {
  std::vector<float> all(static_cast<std::size_t>(rows) * stride);
  device_rows.copy_out(all.data(), what.c_str());
  for (int t = 0; t < rows; ++t) {
    const float* row = all.data() + static_cast<std::size_t>(t) * stride;
    for (int i = width; i < stride; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, row + i, sizeof bits);
      STRATA_EXPECTS(bits == kPoisonFloat, Error,
                     what + " wrote float " + std::to_string(i) + " of row " + std::to_string(t) +
                         ", past the row's " + std::to_string(width));
    }
    std::memcpy(host + static_cast<std::size_t>(t) * width, row, width * sizeof(float));
  }
}

}  // namespace

void gdn_chunk(int device, const GdnCheckShape& s, int tokens, int row_pad, const float* qkv, const float* z,
               const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
               const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* conv_out,
               float* out, float* state_rows, float* conv_rows) {
  const kernels::GdnShape shape{s.n_k_heads, s.n_v_heads, s.head_k_dim, s.head_v_dim, s.conv_kernel,
                                s.tiled_heads, s.interleaved_ba, s.sigmoid_gate, s.eps};
  STRATA_EXPECTS(tokens > 0 && row_pad >= 0 && shape.n_k_heads > 0 && shape.n_v_heads % shape.n_k_heads == 0,
                 InvalidArgument,
                 "gdn_chunk: need tokens > 0, row_pad >= 0 and n_v_heads a multiple of n_k_heads, got tokens=" +
                     std::to_string(tokens) + ", row_pad=" + std::to_string(row_pad) + ", heads " +
                     std::to_string(s.n_v_heads) + "/" + std::to_string(s.n_k_heads));
  support::check_device(device);
  DeviceScope scope(device);
  const int c = shape.conv_channels(), hv = s.n_v_heads, vd = hv * s.head_v_dim;
  const int ba = s.interleaved_ba ? 2 * hv : hv;
  const std::size_t conv_bytes = static_cast<std::size_t>(s.conv_kernel - 1) * c * sizeof(float);
  const std::size_t state_bytes = static_cast<std::size_t>(hv) * s.head_k_dim * s.head_v_dim * sizeof(float);
  DeviceBuffer d_weight = upload(conv_weight, static_cast<std::size_t>(c) * s.conv_kernel * sizeof(float));
  DeviceBuffer d_a = upload(ssm_a, hv * sizeof(float)), d_dt = upload(dt_bias, hv * sizeof(float));
  DeviceBuffer d_norm = upload(norm_weight, s.head_v_dim * sizeof(float));
  GuardedOutput d_conv_state(conv_bytes), d_state(state_bytes);
  STRATA_CUDA_TRY(cudaMemcpy(d_conv_state.data<void>(), conv_state, conv_bytes, cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(cudaMemcpy(d_state.data<void>(), state, state_bytes, cudaMemcpyHostToDevice));

  // The projections as the prompt program writes them: [qkv | z] in one fused row, every row padded with poison.
  kernels::GdnChunkArgs args;
  args.tokens = tokens;
  args.qkv_stride = args.z_stride = c + vd + row_pad;
  args.beta_stride = ba + row_pad;
  args.alpha_stride = hv + row_pad;
  args.conv_out_stride = c + row_pad;
  args.out_stride = vd + row_pad;
  DeviceBuffer d_rows = poisoned(static_cast<std::size_t>(tokens) * args.qkv_stride);
  DeviceBuffer d_beta = poisoned(static_cast<std::size_t>(tokens) * args.beta_stride);
  DeviceBuffer d_alpha = poisoned(s.interleaved_ba ? 0 : static_cast<std::size_t>(tokens) * args.alpha_stride);
  DeviceBuffer d_scratch = poisoned(kernels::gdn_chunk_scratch_floats(shape, tokens));
  GuardedOutput d_conv_out(static_cast<std::size_t>(tokens) * args.conv_out_stride * sizeof(float));
  GuardedOutput d_out(static_cast<std::size_t>(tokens) * args.out_stride * sizeof(float));
  copy_rows_in(d_rows.as<float>(), args.qkv_stride, qkv, tokens, c);
  copy_rows_in(d_rows.as<float>() + c, args.z_stride, z, tokens, vd);
  copy_rows_in(d_beta.as<float>(), args.beta_stride, beta_in, tokens, ba);
  if (!s.interleaved_ba) copy_rows_in(d_alpha.as<float>(), args.alpha_stride, alpha_in, tokens, hv);
  args.qkv = d_rows.as<float>();
  args.z = d_rows.as<float>() + c;
  args.beta_in = d_beta.as<float>();
  args.alpha_in = s.interleaved_ba ? nullptr : d_alpha.as<float>();
  args.conv_weight = d_weight.as<float>();
  args.ssm_a = d_a.as<float>();
  args.dt_bias = d_dt.as<float>();
  args.norm_weight = d_norm.as<float>();
  args.conv_state = d_conv_state.data<float>();
  args.state = d_state.data<float>();
  args.conv_out = d_conv_out.data<float>();
  args.out = d_out.data<float>();
  args.scratch = d_scratch.as<float>();
  STRATA_EXPECTS(!state_rows == !conv_rows, InvalidArgument, "gdn_chunk: row states come as state and conv rows");
  const int state_floats = static_cast<int>(state_bytes / sizeof(float)), conv_floats = (s.conv_kernel - 1) * c;
  const int row_stride = state_rows ? std::max(state_floats, conv_floats) + row_pad : 0;
  GuardedOutput d_state_rows(static_cast<std::size_t>(tokens) * row_stride * sizeof(float));
  GuardedOutput d_conv_rows(static_cast<std::size_t>(tokens) * row_stride * sizeof(float));
  if (state_rows) {
    args.state_rows = d_state_rows.data<float>();
    args.conv_rows = d_conv_rows.data<float>();
    args.row_stride = row_stride;
  }

  Stream stream;
  const CapturedGraph graph(stream.get(), [&](cudaStream_t captured) {
    const cudaError_t launched = kernels::gdn_chunk(shape, args, captured);
    STRATA_EXPECTS(launched != cudaErrorInvalidValue, InvalidArgument,
                   "gdn_chunk refused the shape (gdn_step's limits: dk <= 256, conv_kernel 2..8)");
    STRATA_CUDA_TRY(launched);
  });
  graph.launch(stream.get());
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  copy_rows_out(d_conv_out, args.conv_out_stride, conv_out, tokens, c, "gdn_chunk (conv_out)");
  copy_rows_out(d_out, args.out_stride, out, tokens, vd, "gdn_chunk (out)");
  d_conv_state.copy_out(conv_state, "gdn_chunk (conv state)");
  d_state.copy_out(state, "gdn_chunk (recurrent state)");
  if (state_rows) {
    copy_rows_out(d_state_rows, row_stride, state_rows, tokens, state_floats, "gdn_chunk (state rows)");
    copy_rows_out(d_conv_rows, row_stride, conv_rows, tokens, conv_floats, "gdn_chunk (conv rows)");
  }
}

}  // namespace strata::kernel_check
