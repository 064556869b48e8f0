#include "gdn.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kConvThreads = 256;
constexpr int kHeadThreads = 128;
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

// One block per v-head: normalise its q/k, run the gated delta rule over the head's [dk][dv] state
// (each thread owns state columns, so reads and writes are coalesced over dv), then the gated RMSNorm.
__global__ void gdn_head_kernel(GdnShape shape, GdnStepArgs args) {
  extern __shared__ float shared[];
  const int dk = shape.head_k_dim, dv = shape.head_v_dim, hk = shape.n_k_heads;
  const int h = blockIdx.x;
  const int ratio = shape.n_v_heads / hk;
  const int kh = shape.tiled_heads ? h % hk : h / ratio;
  float* q = shared;
  float* k = q + dk;
  float* o = k + dk;

  float q_sq = 0.0f, k_sq = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q[i] = args.conv_out[kh * dk + i];
    k[i] = args.conv_out[hk * dk + kh * dk + i];
    q_sq += q[i] * q[i];
    k_sq += k[i] * k[i];
  }
  const float q_scale = rsqrtf(block_sum(q_sq) + 1e-6f) * rsqrtf(static_cast<float>(dk));
  const float k_scale = rsqrtf(block_sum(k_sq) + 1e-6f);
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

  float* s = args.state + static_cast<long>(h) * dk * dv;
  const float* v = args.conv_out + 2 * hk * dk + h * dv;
  float o_sq = 0.0f;
  for (int j = threadIdx.x; j < dv; j += blockDim.x) {
    float kv = 0.0f;
    for (int i = 0; i < dk; ++i) kv += s[i * dv + j] * k[i];
    const float delta = (v[j] - decay * kv) * beta;
    float acc = 0.0f;
    for (int i = 0; i < dk; ++i) {
      const float updated = decay * s[i * dv + j] + k[i] * delta;
      s[i * dv + j] = updated;
      acc += updated * q[i];
    }
    o[j] = acc;
    o_sq += acc * acc;
  }
  const float inv = rsqrtf(block_sum(o_sq) / static_cast<float>(dv) + shape.eps);
  for (int j = threadIdx.x; j < dv; j += blockDim.x) {
    const float zj = args.z[h * dv + j];
    const float gate = shape.sigmoid_gate ? sigmoid(zj) : zj * sigmoid(zj);
    args.out[h * dv + j] = o[j] * inv * args.norm_weight[j] * gate;
  }
}

}  // namespace

cudaError_t gdn_step(const GdnShape& shape, const GdnStepArgs& args, cudaStream_t stream) {
  if (shape.n_k_heads <= 0 || shape.n_v_heads <= 0 || shape.n_v_heads % shape.n_k_heads != 0 ||
      shape.head_k_dim <= 0 || shape.head_v_dim <= 0 || shape.conv_kernel < 2 || shape.conv_kernel > kMaxConvKernel)
    return cudaErrorInvalidValue;
  const int channels = shape.conv_channels();
  gdn_conv_kernel<<<(channels + kConvThreads - 1) / kConvThreads, kConvThreads, 0, stream>>>(
      args.qkv, args.conv_weight, args.conv_state, args.conv_out, channels, shape.conv_kernel);
  const size_t smem = static_cast<size_t>(2 * shape.head_k_dim + shape.head_v_dim) * sizeof(float);
  gdn_head_kernel<<<shape.n_v_heads, kHeadThreads, smem, stream>>>(shape, args);
  return cudaGetLastError();
}

}  // namespace strata::kernels
