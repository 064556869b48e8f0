#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {


__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Each lane reads `Vec` weights (16 bytes when Vec > 1) at a time, kUnroll chunks issued before any is
// used so that enough bytes are in flight to cover HBM latency; Vec == 1 handles unaligned shapes.
constexpr int kUnroll = 4;

template <class T, int Vec>
struct alignas(Vec > 1 ? 16 : sizeof(T)) Chunk {
  T v[Vec];
};

template <class T, int Vec>
__device__ __forceinline__ float chunk_dot(const Chunk<T, Vec>& c, const float* __restrict__ x, float acc) {
  if constexpr (Vec > 1) {
#pragma unroll
    for (int j = 0; j < Vec; j += 4) {
      const float4 xv = __ldg(reinterpret_cast<const float4*>(x + j));
      acc = fmaf(to_float(c.v[j]), xv.x, acc);
      acc = fmaf(to_float(c.v[j + 1]), xv.y, acc);
      acc = fmaf(to_float(c.v[j + 2]), xv.z, acc);
      acc = fmaf(to_float(c.v[j + 3]), xv.w, acc);
    }
  } else {
    acc = fmaf(to_float(c.v[0]), __ldg(x), acc);
  }
  return acc;
}

// One matrix (Batched false: gemv_float) or product blockIdx.y of a batch (gemv.cuh), whose matrix, x and y are
// offset here: the loop is the same for both.
template <class T, int Vec, bool Batched>
__global__ void __launch_bounds__(kRowsPerCta * 32)
gemv_float_kernel(const T* __restrict__ w, int rows, int cols, const int* __restrict__ slots, int x_stride,
                  const float* __restrict__ x, float* __restrict__ y, int split) {
  if constexpr (Batched) {
    const int slot = batch_slot(slots);
    if (slot < 0) return;
    w += static_cast<long>(slot) * rows * cols;  // not advanced(): the weights keep their read-only loads
    x = advanced(x, static_cast<long>(blockIdx.y) * x_stride);
    y += static_cast<long>(blockIdx.y) * rows;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (kRowsPerCta / split) + warp / split;
  const int part = warp % split;
  constexpr int kStride = 32 * Vec;
  float acc = 0.0f;
  if (row < rows) {
    const T* wr = w + static_cast<long>(row) * cols;
    const int stride = kStride * split;
    for (int base = part * kStride + lane * Vec; base < cols; base += stride * kUnroll) {
      Chunk<T, Vec> c[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * stride;
        if (i < cols) c[u] = *reinterpret_cast<const Chunk<T, Vec>*>(wr + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * stride;
        if (i < cols) acc = chunk_dot<T, Vec>(c[u], x + i, acc);
      }
    }
  }
  acc = warp_sum(acc);
  store_row(acc, row, rows, warp, lane, split, y);
}

// The kernel for one Vec: the single matrix's when the batch is one product of matrix 0, so gemv_float pays
// nothing for batches.
template <class T, int Vec>
void launch_vec(dim3 grid, const T* w, int rows, int cols, const MatrixBatch& batch, const float* x, float* y,
                int split, cudaStream_t stream) {
  auto* kernel = batch.slots != nullptr ? gemv_float_kernel<T, Vec, true> : gemv_float_kernel<T, Vec, false>;
  kernel<<<grid, kRowsPerCta * 32, 0, stream>>>(w, rows, cols, batch.slots, batch.x_stride, x, y, split);
}

// The 16-byte path needs every row of every matrix and every x_j aligned: cols * sizeof(T) and x_stride * 4
// multiples of 16 keep the bases' alignment.
template <class T>
cudaError_t launch(const void* w, int rows, int cols, const MatrixBatch& batch, const float* x, float* y,
                   cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int split = row_split(rows);
  const dim3 grid = gemv_grid(rows, split, batch.count);
  const T* wt = static_cast<const T*>(w);
  if (cols % kVec == 0 && batch.x_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
    launch_vec<T, kVec>(grid, wt, rows, cols, batch, x, y, split, stream);
  } else {
    launch_vec<T, 1>(grid, wt, rows, cols, batch, x, y, split, stream);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemv_float_batch(FloatKind kind, const void* w, int rows, int cols, const MatrixBatch& batch,
                             const float* x, float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || !valid_batch(batch)) return cudaErrorInvalidValue;
  switch (kind) {
    case FloatKind::F32: return launch<float>(w, rows, cols, batch, x, y, stream);
    case FloatKind::F16: return launch<__half>(w, rows, cols, batch, x, y, stream);
    case FloatKind::BF16: return launch<__nv_bfloat16>(w, rows, cols, batch, x, y, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t gemv_float(FloatKind kind, const void* w, int rows, int cols, const float* x, float* y,
                       cudaStream_t stream) {
  return gemv_float_batch(kind, w, rows, cols, MatrixBatch{nullptr, 1, 0}, x, y, stream);
}

}  // namespace strata::kernels
