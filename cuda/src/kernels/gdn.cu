#include "gdn.cuh"
#include "norm.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kConvThreads = 256;
constexpr int kMaxConvKernel = 8;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// silu(depthwise causal conv) of this token per channel, then the history shifts by one row.
__global__ void gdn_conv_kernel(const float* __restrict__ qkv, const float* __restrict__ weight,
                                float* __restrict__ history, float* __restrict__ out, int channels, int kernel) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float window[kMaxConvKernel];
  for (int j = 0; j < kernel - 1; ++j) window[j] = history[static_cast<long>(j) * channels + c];
  window[kernel - 1] = qkv[c];
  float acc = 0.0f;
  for (int j = 0; j < kernel; ++j) acc += window[j] * weight[static_cast<long>(c) * kernel + j];
  out[c] = acc * sigmoid(acc);
  for (int j = 0; j < kernel - 1; ++j) history[static_cast<long>(j) * channels + c] = window[j + 1];
}

// The delta rule acts on each state column j on its own (kv_j, delta_j, the update and out_j only read column
// j and the head's q, k), so a CTA takes one v-head's tile of 32 columns (a lane each) and its warps split the
// dk rows: every thread loads its rows of the state once, in one batch, and the warps' partial sums meet in
// shared memory. The head's gated RMSNorm needs all dv outputs and runs after (rms_norm_gated).
constexpr int kTileColumns = 32;
constexpr int kHeadWarps = 8;
constexpr int kMaxRowsPerWarp = 32;  // dk <= 256

__global__ void __launch_bounds__(kHeadWarps * 32) gdn_head_kernel(GdnShape shape, GdnStepArgs args) {
  extern __shared__ float shared[];
  const int dk = shape.head_k_dim, dv = shape.head_v_dim, hk = shape.n_k_heads;
  const int h = blockIdx.x;
  const int ratio = shape.n_v_heads / hk;
  const int kh = shape.tiled_heads ? h % hk : h / ratio;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* q = shared;
  float* k = q + dk;
  float* partial = k + dk;  // [kHeadWarps][kTileColumns]

  float q_sq = 0.0f, k_sq = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q[i] = args.conv_out[kh * dk + i];
    k[i] = args.conv_out[hk * dk + kh * dk + i];
    q_sq += q[i] * q[i];
    k_sq += k[i] * k[i];
  }
  const float q_scale = rsqrtf(block_sum(q_sq) + 1e-6f) * rsqrtf(static_cast<float>(dk));
  const float k_scale = rsqrtf(block_sum(k_sq) + 1e-6f);
  __syncthreads();  // every q, k is loaded before any is rescaled
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q[i] *= q_scale;
    k[i] *= k_scale;
  }
  __syncthreads();

  float b, a;
  if (shape.interleaved_ba) {
    const float* ba = args.beta_in + (h / ratio) * 2 * ratio;  // v-head h is entry h % ratio of group h / ratio
    b = ba[h % ratio];
    a = ba[ratio + h % ratio];
  } else {
    b = args.beta_in[h];
    a = args.alpha_in[h];
  }
  const float beta = sigmoid(b);
  const float decay = expf(args.ssm_a[h] * softplus(a + args.dt_bias[h]));

  const int j = blockIdx.y * kTileColumns + lane;
  const bool column = j < dv;
  float* s = args.state + static_cast<long>(h) * dk * dv;
  float rows[kMaxRowsPerWarp];
  float kv = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int i = warp + r * kHeadWarps;
    rows[r] = column && i < dk ? s[static_cast<long>(i) * dv + j] : 0.0f;
  }
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int i = warp + r * kHeadWarps;
    if (i < dk) kv += rows[r] * k[i];
  }
  partial[warp * kTileColumns + lane] = kv;
  __syncthreads();
  kv = 0.0f;
  for (int w = 0; w < kHeadWarps; ++w) kv += partial[w * kTileColumns + lane];
  const float v = column ? args.conv_out[2 * hk * dk + h * dv + j] : 0.0f;
  const float delta = (v - decay * kv) * beta;
  float acc = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int i = warp + r * kHeadWarps;
    if (column && i < dk) {
      const float updated = decay * rows[r] + k[i] * delta;
      s[static_cast<long>(i) * dv + j] = updated;
      acc += updated * q[i];
    }
  }
  __syncthreads();  // every warp has read its kv partials
  partial[warp * kTileColumns + lane] = acc;
  __syncthreads();
  if (warp != 0 || !column) return;
  float out = 0.0f;
  for (int w = 0; w < kHeadWarps; ++w) out += partial[w * kTileColumns + lane];
  args.out[h * dv + j] = out;
}

}  // namespace

cudaError_t gdn_step(const GdnShape& shape, const GdnStepArgs& args, cudaStream_t stream) {
  if (shape.n_k_heads <= 0 || shape.n_v_heads <= 0 || shape.n_v_heads % shape.n_k_heads != 0 ||
      shape.head_k_dim <= 0 || shape.head_k_dim > kHeadWarps * kMaxRowsPerWarp || shape.head_v_dim <= 0 ||
      shape.conv_kernel < 2 || shape.conv_kernel > kMaxConvKernel)
    return cudaErrorInvalidValue;
  const int channels = shape.conv_channels();
  gdn_conv_kernel<<<(channels + kConvThreads - 1) / kConvThreads, kConvThreads, 0, stream>>>(
      args.qkv, args.conv_weight, args.conv_state, args.conv_out, channels, shape.conv_kernel);
  const size_t smem = static_cast<size_t>(2 * shape.head_k_dim + kHeadWarps * kTileColumns) * sizeof(float);
  const dim3 grid(shape.n_v_heads, (shape.head_v_dim + kTileColumns - 1) / kTileColumns);
  gdn_head_kernel<<<grid, kHeadWarps * 32, smem, stream>>>(shape, args);
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  return rms_norm_gated(args.out, args.z, args.norm_weight, args.out, shape.n_v_heads, shape.head_v_dim, shape.eps,
                        shape.sigmoid_gate ? Gate::Sigmoid : Gate::Silu, stream);
}

}  // namespace strata::kernels
