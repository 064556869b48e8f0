// The matrix product of the float forms (matmul.cuh) on bf16 tensor cores. X and f32 / f16 weights are split
// into hi = bf16(v) and lo = bf16(v - hi): v = hi + lo to 16 bits, exactly for f16 (11 bits) and bf16 values,
// and W X = Wh Xh + Wh Xl + Wl Xh up to the Wl Xl term and the split's remainders, at most about 3 * 2^-16 of
// |w| |x| per product (bf16 weights need no lo: 2 products, 2^-16). Every pipeline stage's three products start
// from zero and are added to the float32 accumulator in software, so the tensor cores' own rounding stays
// within one stage's 16 columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "launch.cuh"
#include "matmul.cuh"
#include "matmul_tiles.cuh"

namespace strata::kernels {
namespace {

constexpr int kStageColumns = 16;  // one bf16 mma's K
constexpr int kPairStride = 12;    // words per row: 8 bf16 pairs, padded so that rows 12 g fall in distinct banks
constexpr int kChunk = 4;          // elements one thread loads at a time
constexpr int kChunksPerRow = kStageColumns / kChunk;
constexpr int kWeightChunks = kMatmulWeightTile * kChunksPerRow / kMatmulThreads;  // per thread
static_assert(kMatmulRowTile * kChunksPerRow == kMatmulThreads, "one X chunk per thread");

struct alignas(16) FloatStage {
  unsigned w_hi[kMatmulWeightTile * kPairStride];
  unsigned w_lo[kMatmulWeightTile * kPairStride];
  unsigned x_hi[kMatmulRowTile * kPairStride];
  unsigned x_lo[kMatmulRowTile * kPairStride];
};

// 4 consecutive elements as loaded (0 bits past the row's end): one word each for f32, two per word for f16 and
// bf16. Held in registers while a stage is multiplied and converted only after, so the loads' latency hides
// behind the mma work.
template <class T>
struct Chunk {
  unsigned w[sizeof(T)] = {};
};

template <class T, bool Vec>
__device__ __forceinline__ Chunk<T> load_chunk(const T* row, int col, int cols) {
  Chunk<T> c;
  if constexpr (Vec) {  // cols % 4 == 0: the chunk lies wholly inside the row or wholly past it
    if (col >= cols) return c;
    if constexpr (sizeof(T) == 4) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + col));
      c.w[0] = v.x, c.w[1] = v.y, c.w[2] = v.z, c.w[3] = v.w;
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + col));
      c.w[0] = v.x, c.w[1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (col + i >= cols) break;
      if constexpr (sizeof(T) == 4) {
        c.w[i] = __ldg(reinterpret_cast<const unsigned*>(row) + col + i);
      } else {
        c.w[i / 2] |= static_cast<unsigned>(__ldg(reinterpret_cast<const unsigned short*>(row) + col + i))
                      << (16 * (i % 2));
      }
    }
  }
  return c;
}

// Element i of a chunk as a float32 (exact for every kind).
template <class T>
__device__ __forceinline__ float element(const Chunk<T>& c, int i) {
  if constexpr (sizeof(T) == 4) return __uint_as_float(c.w[i]);
  const unsigned bits = (c.w[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
  if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return __uint_as_float(bits << 16);
}

__device__ __forceinline__ unsigned bits_of(__nv_bfloat162 v) { return *reinterpret_cast<unsigned*>(&v); }

// Stores elements 2 k, 2 k + 1 of a chunk as their hi and lo bf16 pairs.
template <class T>
__device__ __forceinline__ void store_split(const Chunk<T>& c, unsigned* hi, unsigned* lo) {
#pragma unroll
  for (int k = 0; k < kChunk / 2; ++k) {
    const float v0 = element(c, 2 * k), v1 = element(c, 2 * k + 1);
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    const float2 back = __bfloat1622float2(h);
    hi[k] = bits_of(h);
    lo[k] = bits_of(__floats2bfloat162_rn(v0 - back.x, v1 - back.y));
  }
}

template <class T>
constexpr bool kSplitWeights = !std::is_same_v<T, __nv_bfloat16>;

template <class T>
struct FloatMatmulArgs {
  const T* w = nullptr;
  int rows = 0, cols = 0;
  MatmulRows x_rows;
  MatmulGroups groups;
  const float* x = nullptr;
  float* y = nullptr;
};

// Which chunks of the CTA's weight and X rows this thread moves into each stage.
template <class T, bool Vec>
class FloatLoader {
 public:
  __device__ FloatLoader(const FloatMatmulArgs<T>& a, const RowTile& tile, int w0) : cols_(a.cols) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int k = 0; k < kWeightChunks; ++k) {
      const int chunk = tid + k * kMatmulThreads, r = chunk / kChunksPerRow;
      w_from_[k] = a.w + (tile.matrix_row + min(w0 + r, a.rows - 1)) * a.cols;
      w_col_[k] = chunk % kChunksPerRow * kChunk;
      w_to_[k] = r * kPairStride + chunk % kChunksPerRow * (kChunk / 2);
    }
    const int r = tid / kChunksPerRow;
    x_from_ = a.x + static_cast<long>(tile.first + min(r, tile.count - 1)) * a.x_rows.x_stride;
    x_col_ = tid % kChunksPerRow * kChunk;
    x_to_ = r * kPairStride + tid % kChunksPerRow * (kChunk / 2);
  }

  struct Loaded {
    Chunk<T> w[kWeightChunks];
    Chunk<float> x;
  };

  // Issues the loads of the stage at column c0.
  __device__ Loaded load(int c0) const {
    Loaded l;
#pragma unroll
    for (int k = 0; k < kWeightChunks; ++k) l.w[k] = load_chunk<T, Vec>(w_from_[k], c0 + w_col_[k], cols_);
    l.x = load_chunk<float, Vec>(x_from_, c0 + x_col_, cols_);
    return l;
  }

  __device__ void store(FloatStage& stage, const Loaded& l) const {
#pragma unroll
    for (int k = 0; k < kWeightChunks; ++k) {
      if constexpr (kSplitWeights<T>) {
        store_split(l.w[k], stage.w_hi + w_to_[k], stage.w_lo + w_to_[k]);
      } else {  // bf16 pairs as loaded
        stage.w_hi[w_to_[k]] = l.w[k].w[0], stage.w_hi[w_to_[k] + 1] = l.w[k].w[1];
      }
    }
    store_split(l.x, stage.x_hi + x_to_, stage.x_lo + x_to_);
  }

 private:
  const T* w_from_[kWeightChunks];
  const float* x_from_;
  int w_col_[kWeightChunks], w_to_[kWeightChunks];
  int x_col_, x_to_, cols_;
};

// The 4 words of an A (weight rows r, r + 8) or the 2 of a B fragment (X row r): columns 2 t, 2 t + 1 and
// 8 + 2 t, 8 + 2 t + 1 of each row.
__device__ __forceinline__ void weight_fragment(const unsigned* plane, int r, int t, unsigned (&a)[4]) {
  const unsigned* row = plane + r * kPairStride;
  const unsigned* row8 = row + 8 * kPairStride;
  a[0] = row[t], a[1] = row8[t], a[2] = row[4 + t], a[3] = row8[4 + t];
}

// acc += this warp's outputs of one stage: small products first, added to the accumulator once per stage.
template <class T>
__device__ __forceinline__ void multiply_stage(const FloatStage& stage, WarpAccumulator& acc) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int w_warp = warp % kWarpsAlongWeights * 32, x_warp = warp / kWarpsAlongWeights * 32;
  unsigned b_hi[kMmaRowTiles][2], b_lo[kMmaRowTiles][2];
#pragma unroll
  for (int j = 0; j < kMmaRowTiles; ++j) {
    const int row = (x_warp + 8 * j + g) * kPairStride;
    b_hi[j][0] = stage.x_hi[row + t], b_hi[j][1] = stage.x_hi[row + 4 + t];
    b_lo[j][0] = stage.x_lo[row + t], b_lo[j][1] = stage.x_lo[row + 4 + t];
  }
#pragma unroll
  for (int i = 0; i < kMmaWeightTiles; ++i) {
    const int r = w_warp + 16 * i + g;
    unsigned a_hi[4], a_lo[4];
    weight_fragment(stage.w_hi, r, t, a_hi);
    if constexpr (kSplitWeights<T>) weight_fragment(stage.w_lo, r, t, a_lo);
#pragma unroll
    for (int j = 0; j < kMmaRowTiles; ++j) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_bf16_k16(d, a_hi, b_lo[j][0], b_lo[j][1]);
      if constexpr (kSplitWeights<T>) mma_bf16_k16(d, a_lo, b_hi[j][0], b_hi[j][1]);
      mma_bf16_k16(d, a_hi, b_hi[j][0], b_hi[j][1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] += d[e];
    }
  }
}

template <class T, bool Vec>
__global__ void __launch_bounds__(kMatmulThreads, 2) matmul_float_kernel(FloatMatmulArgs<T> args) {
  await_producers();
  release_consumers();
  const RowTile tile = find_row_tile(args.x_rows, args.groups, args.rows);
  if (tile.count <= 0) return;
  __shared__ FloatStage stages[2];
  const int w0 = static_cast<int>(blockIdx.x) * kMatmulWeightTile;
  const FloatLoader<T, Vec> loader(args, tile, w0);
  const int n_stages = (args.cols + kStageColumns - 1) / kStageColumns;
  loader.store(stages[0], loader.load(0));
  __syncthreads();
  WarpAccumulator acc = {};
  for (int s = 0; s < n_stages; ++s) {
    const bool prefetch = s + 1 < n_stages;
    typename FloatLoader<T, Vec>::Loaded next;
    if (prefetch) next = loader.load((s + 1) * kStageColumns);
    multiply_stage<T>(stages[s % 2], acc);
    // The other stage was last read in step s - 1, which every warp finished before the barrier ending it.
    if (prefetch) loader.store(stages[(s + 1) % 2], next);
    __syncthreads();
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  store_outputs(acc, w0 + warp % kWarpsAlongWeights * 32, warp / kWarpsAlongWeights * 32, args.rows, tile,
                args.x_rows.y_stride, args.y);
}

template <class T>
cudaError_t launch_typed(const void* w, int rows, int cols, const MatmulRows& x_rows, const MatmulGroups* groups,
                         const float* x, float* y, cudaStream_t stream) {
  FloatMatmulArgs<T> args;
  args.w = static_cast<const T*>(w);
  args.rows = rows, args.cols = cols;
  args.x_rows = x_rows;
  if (groups != nullptr) args.groups = *groups;
  args.x = x, args.y = y;
  const dim3 grid = matmul_grid(rows, x_rows, groups);
  // The vector loads need every chunk aligned: each row's start (cols, x_stride multiples of 4) and the bases.
  const bool vec = cols % kChunk == 0 && x_rows.x_stride % kChunk == 0 &&
                   reinterpret_cast<std::uintptr_t>(w) % (kChunk * sizeof(T)) == 0 &&
                   reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  auto* kernel = vec ? matmul_float_kernel<T, true> : matmul_float_kernel<T, false>;
  return launch(kernel, grid, kMatmulThreads, 0, stream, args);
}

cudaError_t launch_kind(FloatKind kind, const void* w, int rows, int cols, const MatmulRows& x_rows,
                        const MatmulGroups* groups, const float* x, float* y, cudaStream_t stream) {
  if (!valid_rows(rows, cols, x_rows, groups)) return cudaErrorInvalidValue;
  switch (kind) {
    case FloatKind::F32: return launch_typed<float>(w, rows, cols, x_rows, groups, x, y, stream);
    case FloatKind::F16: return launch_typed<__half>(w, rows, cols, x_rows, groups, x, y, stream);
    case FloatKind::BF16: return launch_typed<__nv_bfloat16>(w, rows, cols, x_rows, groups, x, y, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t matmul_float(FloatKind kind, const void* w, int rows, int cols, const MatmulRows& x_rows,
                         const float* x, float* y, cudaStream_t stream) {
  return launch_kind(kind, w, rows, cols, x_rows, nullptr, x, y, stream);
}

cudaError_t matmul_float_grouped(FloatKind kind, const void* w_stack, int rows, int cols, const MatmulRows& x_rows,
                                 const MatmulGroups& groups, const float* x, float* y, cudaStream_t stream) {
  return launch_kind(kind, w_stack, rows, cols, x_rows, &groups, x, y, stream);
}

}  // namespace strata::kernels
