#include "gemv_quant_mma.cuh"

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "gemv.cuh"
#include "launch.cuh"
#include "quant_shapes.cuh"
#include "tensor_core.cuh"

namespace strata::kernels {
namespace {

constexpr int kTileRows = 16;     // an mma's M: the weight rows of a CTA
constexpr int kTileInputs = 8;    // its N: the inputs of one mma, zero past `inputs`
constexpr int kMaxTiles = kMaxMmaInputs / kTileInputs;  // mmas a block (input tiles), A's fragment loaded once
constexpr int kLaneClasses = 32;  // the one-row GEMV's lanes, whose sums the order keeps apart
constexpr int kWarps = 8;
static_assert(kMaxTiles * kTileInputs == kMaxMmaInputs && kMaxGemvInputs <= kTileInputs * kMaxTiles);
static_assert(kWarps * 32 >= kTileRows * kTileInputs * kMaxTiles, "the CTA's threads store the outputs, one each");
// A tile's staged rows at most: 227 KB of shared memory a CTA on sm_90, less the warps' subtrees. A matrix wider than
// that (Q8_0 beyond ~12,000 columns) keeps the integer kernel.
constexpr std::size_t kMaxStagedBytes = 200 * 1024;

template <class S>
constexpr bool kTakes = S::kGroup == kCodeBlock && S::kSuper == kCodeBlock && !S::kBook && !S::kScaleF32 &&
                        !S::kSubScales && !S::kMins && (S::kBits == 8 || S::kBits == 4);

// Bytes a staged row takes: its codes, padded so that its words start kCodeWords banks after the row before. A
// fragment load then finds the 8 rows g of a warp in distinct banks (8-bit codes: 2 words a lane, so rows 0-3 fill
// the 32 banks once and 4-7 once more; 4-bit: 1 word a lane, all 8 rows once).
template <class S>
__host__ __device__ constexpr int staged_stride(int n_blocks) {
  const int words = n_blocks * S::kCodeWords;
  return (words + ((S::kCodeWords - words) % 32 + 32) % 32) * 4;
}

// The tile's shared memory: 16 rows of codes, then the f16 scales block-major ([block][row]: a fragment's 8 rows
// read 8 consecutive halves).
template <class S>
std::size_t staged_bytes(int n_blocks) {
  return static_cast<std::size_t>(kTileRows) * staged_stride<S>(n_blocks) +
         static_cast<std::size_t>(n_blocks) * kTileRows * sizeof(__half);
}

// The CTA's rows first .. first + tile_rows - 1 copied into `staged`; rows past the matrix as zeros (walked, never
// stored). Every thread of the CTA calls it; the tile is complete when it returns.
template <class S>
__device__ __forceinline__ void stage_tile(const QuantPlanes& p, int first, int tile_rows, int n_blocks, int stride,
                                           unsigned char* staged, __half* scales) {
  constexpr int kBlockBytes = kCodeBlock * S::kBits / 8;
  const int row_bytes = n_blocks * kBlockBytes, pieces = row_bytes / 16;
  const std::uint8_t* codes = p.codes + static_cast<long>(first) * row_bytes;
  for (int k = static_cast<int>(threadIdx.x); k < kTileRows * pieces; k += static_cast<int>(blockDim.x)) {
    const int r = k / pieces, at = k % pieces * 16;
    if (r < tile_rows) {
      copy_async<16>(staged + r * stride + at, codes + static_cast<long>(r) * row_bytes + at);
    } else {
      *reinterpret_cast<uint4*>(staged + r * stride + at) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  commit_copies();
  const __half* d = static_cast<const __half*>(p.d) + static_cast<long>(first) * n_blocks;
  for (int k = static_cast<int>(threadIdx.x); k < kTileRows * n_blocks; k += static_cast<int>(blockDim.x)) {
    const int r = k / n_blocks, b = k % n_blocks;
    scales[b * kTileRows + r] = r < tile_rows ? __ldg(d + k) : __float2half(0.0f);
  }
  wait_copies<0>();
  __syncthreads();
}

// A thread's outputs: Tiles input tiles of an mma's 4 (weight row g + 8 (e / 2), input 8 tile + 2 t + e % 2).
template <int Tiles>
using Outputs = float[Tiles][4];

// One warp's walk of the staged tile: leaf(position, sums) is the (part, lane class) leaf at bit-reversed position
// `position` of the part: the one-row GEMV's lane sum of that class, for the thread's outputs.
template <class S, int Split, int Tiles>
struct TileWalk {
  const unsigned char* staged;
  const __half* scales;
  int stride, n_blocks, part, bias_shift;
  GlobalQ8 column[Tiles];  // B's column g of each tile: input 8 tile + g (zeros past `inputs`)
  bool column_live[Tiles];
  GlobalQ8 x[Tiles][2];    // the inputs of the thread's outputs: 8 tile + 2 t and 8 tile + 2 t + 1
  int g, t;

  __device__ __forceinline__ void operator()(int position, Outputs<Tiles>& sums) const {
    const int lane_class = static_cast<int>(__brev(static_cast<unsigned>(position)) >> 27);
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[tile][e] = 0.0f;
    }
    for (int b = part * kLaneClasses + lane_class; b < n_blocks; b += kLaneClasses * Split) {
      unsigned a[4];
      weights(b, a);
      const float row_scale[2] = {__half2float(scales[b * kTileRows + g]),
                                  __half2float(scales[b * kTileRows + g + 8])};
#pragma unroll
      for (int tile = 0; tile < Tiles; ++tile) {
        unsigned b0 = 0u, b1 = 0u;
        if (column_live[tile]) column_words(column[tile], b, b0, b1);
        int dots[4] = {0, 0, 0, 0};
        mma_s8_k32(dots, a, b0, b1);
        const float dx[2] = {x[tile][0].scale(b), x[tile][1].scale(b)};
        const int xsum[2] = {x[tile][0].sum(b), x[tile][1].sum(b)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float scale[1] = {row_scale[e / 2]}, no_offset[1] = {0.0f};
          const int dot[1] = {dots[e]}, block_sum[1] = {xsum[e % 2]};
          sums[tile][e] = quant_rows::add_block(
              sums[tile][e], dx[e % 2], quant_rows::block_term<S>(scale, no_offset, dot, block_sum, bias_shift));
        }
      }
    }
  }

  // A's fragment of block b: the thread's 8 k positions of rows g and g + 8 (a dot sums over k in any order, so
  // A and B need only agree): 8-bit codes as bytes 8 t .. 8 t + 7 (shifted by -128, as the integer walk's
  // operand), 4-bit codes as the low and high nibbles of word t (elements 4 t.. and 16 + 4 t..).
  __device__ __forceinline__ void weights(int b, unsigned (&a)[4]) const {
    constexpr int kBlockBytes = kCodeBlock * S::kBits / 8;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const unsigned char* block = staged + (g + 8 * half) * stride + b * kBlockBytes;
      if constexpr (S::kBits == 8) {
        const uint2 w = *reinterpret_cast<const uint2*>(block + 8 * t);
        a[half] = w.x ^ 0x80808080u;
        a[2 + half] = w.y ^ 0x80808080u;
      } else {
        const unsigned w = *reinterpret_cast<const unsigned*>(block + 4 * t);
        a[half] = w & 0x0F0F0F0Fu;
        a[2 + half] = (w >> 4) & 0x0F0F0F0Fu;
      }
    }
  }

  // B's fragment of block b: an input's codes at the k positions weights() gives A.
  __device__ __forceinline__ void column_words(const GlobalQ8& column, int b, unsigned& b0, unsigned& b1) const {
    const std::int8_t* block = column.xq + static_cast<long>(b) * kCodeBlock;
    if constexpr (S::kBits == 8) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(block) + t);
      b0 = w.x, b1 = w.y;
    } else {
      b0 = __ldg(reinterpret_cast<const unsigned*>(block) + t);
      b1 = __ldg(reinterpret_cast<const unsigned*>(block) + 4 + t);
    }
  }
};

// The pairwise tree over N leaves from `position`: the butterfly's levels for the N lanes of an aligned run of
// bit-reversed positions.
template <int N, int Tiles, class Leaf>
__device__ __forceinline__ void fold_leaves(const Leaf& leaf, int position, Outputs<Tiles>& sums) {
  if constexpr (N == 1) {
    leaf(position, sums);
  } else {
    Outputs<Tiles> right;
    fold_leaves<N / 2, Tiles>(leaf, position, sums);
    fold_leaves<N / 2, Tiles>(leaf, position + N / 2, right);
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[tile][e] += right[tile][e];
    }
  }
}

// The butterfly's levels above the warps' runs: the tree over N warps' subtrees from warp w of output (r, i).
template <int N>
__device__ __forceinline__ float fold_warps(const float (&subtrees)[kWarps][kTileRows][kMaxMmaInputs], int w, int r,
                                            int i) {
  if constexpr (N == 1) {
    return subtrees[w][r][i];
  } else {
    return fold_warps<N / 2>(subtrees, w, r, i) + fold_warps<N / 2>(subtrees, w + N / 2, r, i);
  }
}

// y_i = W x_i for i < inputs over one 16-row tile a CTA, each output the one-row GEMV's bits (gemv_quant_mma.cuh):
// Split is gemv_quant's warps a row for the matrix (row_split), so its lanes' classes are Split x 32 leaves, of which
// each warp folds an aligned run of 4 x Split; Tiles the mmas a block (8 inputs each).
template <class S, int Split, int Tiles>
__global__ void __launch_bounds__(kWarps * 32)
gemv_quant_mma_kernel(QuantPlanes p, int rows, int cols, int code_bias, StridedQ8 acts, int inputs,
                      float* __restrict__ y) {
  await_producers();
  release_consumers();
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ float subtrees[kWarps][kTileRows][kMaxMmaInputs];
  const int n_blocks = cols / kCodeBlock, stride = staged_stride<S>(n_blocks);
  __half* scales = reinterpret_cast<__half*>(staged + kTileRows * stride);
  const int first = static_cast<int>(blockIdx.x) * kTileRows;
  const int tile_rows = min(kTileRows, rows - first);
  stage_tile<S>(p, first, tile_rows, n_blocks, stride, staged, scales);

  constexpr int kRun = kLaneClasses * Split / kWarps;  // a warp's leaves: within one part, as kRun <= 32
  static_assert(kRun >= 1 && kRun <= kLaneClasses && kLaneClasses % kRun == 0, "a warp's run is a subtree");
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  // Inputs past `inputs` read input 0 (never stored) or, as B's column, zeros.
  const auto input = [&](int i) { return acts[i < inputs ? i : 0]; };
  TileWalk<S, Split, Tiles> walk{staged, scales, stride, n_blocks, warp * kRun / kLaneClasses,
                                 (S::kBits == 8 ? 128 : 0) - code_bias,  // as quant_rows_partials' bias_shift
                                 {}, {}, {}, g, t};
#pragma unroll
  for (int tile = 0; tile < Tiles; ++tile) {
    const int base = kTileInputs * tile;
    walk.column[tile] = input(base + g);
    walk.column_live[tile] = base + g < inputs;
    walk.x[tile][0] = input(base + 2 * t);
    walk.x[tile][1] = input(base + 2 * t + 1);
  }
  Outputs<Tiles> sums;
  fold_leaves<kRun, Tiles>(walk, warp * kRun % kLaneClasses, sums);
#pragma unroll
  for (int tile = 0; tile < Tiles; ++tile) {
    const int i0 = kTileInputs * tile + 2 * t;
    subtrees[warp][g][i0] = sums[tile][0];
    subtrees[warp][g][i0 + 1] = sums[tile][1];
    subtrees[warp][g + 8][i0] = sums[tile][2];
    subtrees[warp][g + 8][i0 + 1] = sums[tile][3];
  }
  __syncthreads();

  constexpr int kInputs = kTileInputs * Tiles;
  const int r = static_cast<int>(threadIdx.x) / kInputs, i = static_cast<int>(threadIdx.x) % kInputs;
  if (r >= tile_rows || i >= inputs) return;  // threads past the tile's outputs too (r >= 16)
  constexpr int kPartWarps = kWarps / Split;
  float total;
  if constexpr (Split == 1) {
    total = fold_warps<kPartWarps>(subtrees, 0, r, i);
  } else {  // store_row's sum of the parts in turn
    total = 0.0f;
#pragma unroll
    for (int part = 0; part < Split; ++part) total += fold_warps<kPartWarps>(subtrees, part * kPartWarps, r, i);
  }
  y[static_cast<long>(i) * rows + first + r] = total;
}

template <class S, int Tiles>
auto* mma_kernel(int split) {
  return split == 1 ? gemv_quant_mma_kernel<S, 1, Tiles>
         : split == 2 ? gemv_quant_mma_kernel<S, 2, Tiles>
                      : gemv_quant_mma_kernel<S, 4, Tiles>;
}

template <class S>
cudaError_t launch_shape(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                         const StridedQ8& acts, float* y, cudaStream_t stream) {
  static_assert(kMaxTiles == 2, "a kernel for one input tile and one for two");
  const int split = row_split(rows);
  auto* kernel = inputs <= kTileInputs ? mma_kernel<S, 1>(split) : mma_kernel<S, 2>(split);
  const std::size_t shared = staged_bytes<S>(cols / kCodeBlock);
  const cudaError_t set =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (set != cudaSuccess) return set;
  const dim3 grid(static_cast<unsigned>((rows + kTileRows - 1) / kTileRows));
  return launch(kernel, grid, kWarps * 32, shared, stream, planes, rows, cols, form.code_bias, acts, inputs, y);
}

}  // namespace

bool gemv_quant_mma_takes(const QuantForm& form, int cols) {
  bool takes = false;
  KnownShapes::visit(form, [&](auto shape) {
    using S = decltype(shape);
    if constexpr (kTakes<S>) {
      takes = cols > 0 && cols % kCodeBlock == 0 && staged_bytes<S>(cols / kCodeBlock) <= kMaxStagedBytes;
    }
  });
  return takes;
}

cudaError_t gemv_quant_mma(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                           const StridedQ8& acts, float* y, cudaStream_t stream) {
  if (rows <= 0 || inputs < 1 || inputs > kMaxMmaInputs || !gemv_quant_mma_takes(form, cols)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t status = cudaErrorInvalidValue;
  KnownShapes::visit(form, [&](auto shape) {
    using S = decltype(shape);
    if constexpr (kTakes<S>) status = launch_shape<S>(form, planes, rows, cols, inputs, acts, y, stream);
  });
  return status;
}

}  // namespace strata::kernels
