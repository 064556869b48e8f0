#include "ple.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kPleThreads = 256;
constexpr int kMaxConvKernel = 8;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One block per stream h: its key/query norms and gate, then for each of its n channels the normed gated
// value, the dilated conv over the history and the history shift (each channel owned by one thread).
__global__ void ple_step_kernel(PleShape shape, PleStepArgs args) {
  const int n = shape.width, h = blockIdx.x, k_taps = shape.conv_kernel, rows = shape.history_rows();
  const long base = static_cast<long>(h) * n;
  float kk = 0.0f, qq = 0.0f, kq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float k = args.key[base + i], q = args.streams[base + i];
    kk += k * k;
    qq += q * q;
    kq += (k * args.norm_key[base + i]) * (q * args.norm_query[base + i]);
  }
  kk = block_sum(kk);
  qq = block_sum(qq);
  kq = block_sum(kq);
  const float inv_k = rsqrtf(kk / n + shape.eps), inv_q = rsqrtf(qq / n + shape.eps);
  const float score = kq * inv_k * inv_q * rsqrtf(static_cast<float>(n));
  const float gate = sigmoid(copysignf(sqrtf(fmaxf(fabsf(score), 1e-6f)), score));

  float gg = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float g = gate * args.value[i];
    gg += g * g;
  }
  const float inv_g = rsqrtf(block_sum(gg) / n + shape.eps);
  const long channels = static_cast<long>(shape.streams) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const long c = base + i;
    const float gated = gate * args.value[i];
    const float normed = gated * inv_g * args.norm_conv[c];
    float acc = normed * args.conv_weight[c * k_taps + k_taps - 1];
    for (int j = 0; j < k_taps - 1; ++j)  // tap j reads the row dilation * (K-1-j) tokens back
      acc += args.history[(rows - shape.dilation * (k_taps - 1 - j)) * channels + c] * args.conv_weight[c * k_taps + j];
    for (int r = 0; r + 1 < rows; ++r) args.history[r * channels + c] = args.history[(r + 1) * channels + c];
    args.history[(rows - 1) * channels + c] = normed;
    args.out[c] = gated + acc * sigmoid(acc);
  }
}

}  // namespace

cudaError_t ple_step(const PleShape& shape, const PleStepArgs& args, cudaStream_t stream) {
  if (shape.streams <= 0 || shape.width <= 0 || shape.dilation <= 0 || shape.conv_kernel < 2 ||
      shape.conv_kernel > kMaxConvKernel)
    return cudaErrorInvalidValue;
  ple_step_kernel<<<shape.streams, kPleThreads, 0, stream>>>(shape, args);
  return cudaGetLastError();
}

}  // namespace strata::kernels
