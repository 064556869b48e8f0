#include "gdn.cuh"
#include "gdn_token.cuh"
#include "launch.cuh"
#include "norm.cuh"
#include "quantize.cuh"

namespace strata::kernels {
namespace {

using namespace gdn_token;

constexpr int kConvThreads = 256;

// silu(depthwise causal conv) of this token per channel, then the history shifts by one row.
__global__ void gdn_conv_kernel(const float* __restrict__ qkv, const float* __restrict__ weight,
                                float* __restrict__ history, float* __restrict__ out, int channels, int kernel) {
  await_producers();
  release_consumers();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float window[kMaxConvKernel];
  for (int j = 0; j < kernel - 1; ++j) window[j] = history[static_cast<long>(j) * channels + c];
  window[kernel - 1] = qkv[c];
  out[c] = conv_silu(window, weight + static_cast<long>(c) * kernel, kernel);
  for (int j = 0; j < kernel - 1; ++j) history[static_cast<long>(j) * channels + c] = window[j + 1];
}

// The delta rule acts on each state column j on its own (kv_j, delta_j, the update and out_j only read column
// j and the head's q, k), so a CTA takes one v-head's tile of 32 columns (a lane each) and its warps split the
// dk rows: every thread loads its rows of the state once, in one batch, and the warps' partial sums meet in
// shared memory. The head's gated RMSNorm needs all dv outputs and runs after (rms_norm_gated).
__global__ void __launch_bounds__(kHeadThreads) gdn_head_kernel(GdnShape shape, GdnStepArgs args) {
  await_producers();
  release_consumers();
  extern __shared__ float shared[];
  const int dk = shape.head_k_dim, dv = shape.head_v_dim, hk = shape.n_k_heads;
  const int h = blockIdx.x;
  const int kh = k_head_of(shape, h);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* q = shared;
  float* k = q + dk;
  float* partial = k + dk;  // [kHeadWarps][kTileColumns]

  normalise_qk(args.conv_out + kh * dk, args.conv_out + hk * dk + kh * dk, q, k, dk);
  __syncthreads();
  const Gates gates = gates_of(shape, args.beta_in, args.alpha_in, args.ssm_a, args.dt_bias, h);

  const int j = blockIdx.y * kTileColumns + lane;
  const bool column = j < dv;
  const RowSlice mine = row_slice(warp, dk);
  float* s = args.state + (static_cast<long>(h) * dk + mine.first) * dv + j;  // this thread's first row
  float rows[kMaxRowsPerThread];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerThread; ++r) rows[r] = column && r < mine.count ? s[static_cast<long>(r) * dv] : 0.0f;
  partial[warp * kTileColumns + lane] = column_dot<kMaxRowsPerThread, false>(rows, k + mine.first, mine.count);
  __syncthreads();
  const float v = column ? args.conv_out[2 * hk * dk + h * dv + j] : 0.0f;
  const float delta = delta_of(v, sum_partials(partial, lane), gates);
  const float out = column_update<kMaxRowsPerThread, false>(rows, k + mine.first, q + mine.first, gates.decay, delta,
                                                            mine.count, column ? s : nullptr, dv);
  __syncthreads();  // every warp has read its kv partials
  partial[warp * kTileColumns + lane] = out;
  __syncthreads();
  if (warp == 0 && column) args.out[h * dv + j] = sum_partials(partial, lane);
}

}  // namespace

cudaError_t gdn_step(const GdnShape& shape, const GdnStepArgs& args, cudaStream_t stream) {
  if (!shape_supported(shape)) return cudaErrorInvalidValue;
  const int channels = shape.conv_channels();
  const cudaError_t convolved = launch(gdn_conv_kernel, (channels + kConvThreads - 1) / kConvThreads, kConvThreads, 0,
                                      stream, args.qkv, args.conv_weight, args.conv_state, args.conv_out, channels,
                                      shape.conv_kernel);
  if (convolved != cudaSuccess) return convolved;
  const size_t smem = static_cast<size_t>(2 * shape.head_k_dim + kHeadWarps * kTileColumns) * sizeof(float);
  const dim3 grid(shape.n_v_heads, (shape.head_v_dim + kTileColumns - 1) / kTileColumns);
  const cudaError_t stepped = launch(gdn_head_kernel, grid, kHeadThreads, smem, stream, shape, args);
  if (stepped != cudaSuccess) return stepped;
  // The gated norm writes out's q8_32 form when each head is whole blocks; otherwise a quantize follows it.
  const bool heads_in_blocks = shape.head_v_dim % kQ8Block == 0;
  const Gate gate = shape.sigmoid_gate ? Gate::Sigmoid : Gate::Silu;
  const cudaError_t normed = rms_norm_gated(args.out, args.z, args.norm_weight, args.out, shape.n_v_heads,
                                            shape.head_v_dim, shape.eps, gate, stream,
                                            heads_in_blocks ? args.out_q8 : Q8Blocks{});
  if (normed != cudaSuccess || heads_in_blocks || args.out_q8.xq == nullptr) return normed;
  const Q8Blocks& q8 = args.out_q8;
  return quantize_q8_32(args.out, q8.xq, q8.dx, q8.sums, static_cast<long>(shape.n_v_heads) * shape.head_v_dim,
                        stream);
}

}  // namespace strata::kernels
