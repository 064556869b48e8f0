#include "norm.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kNormThreads = 256;   // rows of a few thousand floats
constexpr int kWideThreads = 1024;  // a slice of 2048+ floats (a 2560 row, a hyper-connection stream): one
                                    // CTA per slice, so the whole device waits on few CTAs' serial loads
constexpr int kHeadThreads = 128;   // one head (head_dim 128) per CTA

enum class Kind { Rms, GatedSigmoid, GatedSilu, L2 };

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

// One CTA per normalised slice of `cols` floats (a row, a stream, a head). w advances with the slice index
// modulo `w_slices` (1: one shared gamma; groups: one gamma slice per stream); L2 has no weight.
template <Kind K>
__global__ void norm_kernel(const float* x, const float* __restrict__ z, const float* __restrict__ w, float* y,
                            int cols, int w_slices, float eps) {  // y may alias x: no __restrict__ on them
  const long slice = blockIdx.x;
  const float* xs = x + slice * cols;
  float* ys = y + slice * cols;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += xs[i] * xs[i];
  sum_sq = block_sum(sum_sq);
  if constexpr (K == Kind::L2) {
    const float scale = rsqrtf(sum_sq + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ys[i] = xs[i] * scale;
  } else {
    const float scale = rsqrtf(sum_sq / static_cast<float>(cols) + eps);
    const float* ws = w + (slice % w_slices) * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = xs[i] * scale * ws[i];
      if constexpr (K == Kind::GatedSigmoid) v *= sigmoid(z[slice * cols + i]);
      if constexpr (K == Kind::GatedSilu) v *= z[slice * cols + i] * sigmoid(z[slice * cols + i]);
      ys[i] = v;
    }
  }
}

template <Kind K>
cudaError_t launch(const float* x, const float* z, const float* w, float* y, long slices, int cols, int w_slices,
                   float eps, int threads, cudaStream_t stream) {
  if (slices <= 0 || cols <= 0 || w_slices <= 0) return cudaErrorInvalidValue;
  if (cols >= 2048) threads = kWideThreads;
  norm_kernel<K><<<static_cast<unsigned>(slices), threads, 0, stream>>>(x, z, w, y, cols, w_slices, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int cols, float eps, cudaStream_t stream) {
  return launch<Kind::Rms>(x, nullptr, w, y, rows, cols, 1, eps, kNormThreads, stream);
}

cudaError_t rms_norm_grouped(const float* x, const float* w, float* y, int rows, int groups, int cols, float eps,
                             cudaStream_t stream) {
  if (rows <= 0 || groups <= 0) return cudaErrorInvalidValue;
  return launch<Kind::Rms>(x, nullptr, w, y, static_cast<long>(rows) * groups, cols, groups, eps, kNormThreads,
                           stream);
}

cudaError_t rms_norm_gated(const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                           float eps, Gate gate, cudaStream_t stream) {
  if (gate == Gate::Sigmoid)
    return launch<Kind::GatedSigmoid>(x, z, w, y, heads, head_dim, 1, eps, kHeadThreads, stream);
  return launch<Kind::GatedSilu>(x, z, w, y, heads, head_dim, 1, eps, kHeadThreads, stream);
}

cudaError_t l2_norm(const float* x, float* y, int heads, int head_dim, float eps, cudaStream_t stream) {
  return launch<Kind::L2>(x, nullptr, nullptr, y, heads, head_dim, 1, eps, kHeadThreads, stream);
}

}  // namespace strata::kernels
