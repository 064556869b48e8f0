#include "launch.cuh"
#include "norm.cuh"
#include "q8_32_blocks.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kNormThreads = 256;   // rows of a few thousand floats
constexpr int kWideThreads = 1024;  // a slice of 2048+ floats (a 2560 row, a hyper-connection stream): one
                                    // CTA per slice, so the whole device waits on few CTAs' serial loads
constexpr int kHeadThreads = 128;   // one head (head_dim 128) per CTA

enum class Kind { Rms, GatedSigmoid, GatedSilu, L2 };

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

// Where a launch's slices lie: slice s is part s % per_row of row s / per_row; x and y rows are x_stride
// floats apart, z rows z_stride (the gated norm of T tokens reads z out of the wider fused projection rows).
struct Slices {
  int per_row;
  long x_stride, z_stride;
};
Slices packed(int cols) { return {1, cols, cols}; }

// One CTA per normalised slice of `cols` floats (a row, a stream, a head). w advances with the slice index
// modulo `w_slices` (1: one shared gamma; groups: one gamma slice per stream); L2 has no weight. y_q8 (packed
// slices, cols a multiple of 32) takes y's q8_32 form: each warp's pass of the loop holds one whole block.
template <Kind K>
__global__ void norm_kernel(const float* x, const float* __restrict__ z, const float* __restrict__ w, float* y,
                            int cols, int w_slices, Slices at, float eps, Q8Blocks y_q8) {  // y may alias x
  await_producers();
  release_consumers();
  const long slice = blockIdx.x;
  const long row = slice / at.per_row, part = slice % at.per_row;
  const float* xs = x + row * at.x_stride + part * cols;
  float* ys = y + row * at.x_stride + part * cols;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum_sq += xs[i] * xs[i];
  sum_sq = block_sum(sum_sq);
  if constexpr (K == Kind::L2) {
    const float scale = rsqrtf(sum_sq + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ys[i] = xs[i] * scale;
  } else {
    const float scale = rsqrtf(sum_sq / static_cast<float>(cols) + eps);
    const float* ws = w + (slice % w_slices) * cols;
    const float* zs = K == Kind::Rms ? nullptr : z + row * at.z_stride + part * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = xs[i] * scale * ws[i];
      if constexpr (K == Kind::GatedSigmoid) v *= sigmoid(zs[i]);
      if constexpr (K == Kind::GatedSilu) v *= zs[i] * sigmoid(zs[i]);
      ys[i] = v;
      store_q8_32(v, y_q8, slice * cols + i);
    }
  }
}

template <Kind K>
cudaError_t run_norm(const float* x, const float* z, const float* w, float* y, long slices, int cols, int w_slices,
                   Slices at, float eps, int threads, cudaStream_t stream, const Q8Blocks& y_q8 = {}) {
  if (slices <= 0 || cols <= 0 || w_slices <= 0) return cudaErrorInvalidValue;
  if (y_q8.xq != nullptr && (cols % kQ8Block != 0 || at.x_stride != static_cast<long>(at.per_row) * cols))
    return cudaErrorInvalidValue;  // a q8_32 form is of packed slices of whole blocks
  if (cols >= 2048) threads = kWideThreads;
  return launch(norm_kernel<K>, static_cast<unsigned>(slices), threads, 0, stream, x, z, w, y, cols, w_slices, at, eps,
                y_q8);
}

// The gated norm of `rows` rows of `heads` heads, with y's q8_32 form where asked (packed rows only).
cudaError_t gated(const float* x, int x_stride, const float* z, int z_stride, const float* w, float* y, int rows,
                  int heads, int head_dim, float eps, Gate gate, cudaStream_t stream, const Q8Blocks& y_q8) {
  if (rows <= 0 || heads <= 0 || head_dim <= 0 || x_stride < heads * head_dim || z_stride < heads * head_dim)
    return cudaErrorInvalidValue;
  const long slices = static_cast<long>(rows) * heads;
  const Slices at{heads, x_stride, z_stride};
  if (gate == Gate::Sigmoid)
    return run_norm<Kind::GatedSigmoid>(x, z, w, y, slices, head_dim, 1, at, eps, kHeadThreads, stream, y_q8);
  return run_norm<Kind::GatedSilu>(x, z, w, y, slices, head_dim, 1, at, eps, kHeadThreads, stream, y_q8);
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int cols, float eps, cudaStream_t stream,
                     const Q8Blocks& y_q8) {
  return run_norm<Kind::Rms>(x, nullptr, w, y, rows, cols, 1, packed(cols), eps, kNormThreads, stream, y_q8);
}

cudaError_t rms_norm_grouped(const float* x, const float* w, float* y, int rows, int groups, int cols, float eps,
                             cudaStream_t stream) {
  if (rows <= 0 || groups <= 0) return cudaErrorInvalidValue;
  return run_norm<Kind::Rms>(x, nullptr, w, y, static_cast<long>(rows) * groups, cols, groups, packed(cols), eps,
                             kNormThreads, stream);
}

cudaError_t rms_norm_gated(const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                           float eps, Gate gate, cudaStream_t stream, const Q8Blocks& y_q8) {
  return gated(x, heads * head_dim, z, heads * head_dim, w, y, 1, heads, head_dim, eps, gate, stream, y_q8);
}

cudaError_t rms_norm_gated_rows(const float* x, int x_stride, const float* z, int z_stride, const float* w, float* y,
                                int rows, int heads, int head_dim, float eps, Gate gate, cudaStream_t stream) {
  return gated(x, x_stride, z, z_stride, w, y, rows, heads, head_dim, eps, gate, stream, {});
}

cudaError_t l2_norm(const float* x, float* y, int heads, int head_dim, float eps, cudaStream_t stream) {
  return run_norm<Kind::L2>(x, nullptr, nullptr, y, heads, head_dim, 1, packed(head_dim), eps, kHeadThreads, stream);
}

}  // namespace strata::kernels
