#include "gemv_quant_mma.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
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
constexpr int kLeaves = kLaneClasses / kWarps;  // the leaves a warp folds: a CTA walks one part's 32
constexpr int kChunkBlocks = kLaneClasses;      // a stage: the part's next block of every lane class
// Stages in flight: the loads of the next chunks fly while a chunk is computed. 3 keep a Q8_0 CTA at ~55 KB, so
// that 4 fit an SM beside each other.
constexpr int kStages = 3;
constexpr int kMaxDevicesKnown = 64;  // devices whose resident CTAs are remembered (others are asked each launch)
static_assert(kMaxTiles * kTileInputs == kMaxMmaInputs && kMaxGemvInputs <= kTileInputs * kMaxTiles);
static_assert(kWarps * 32 >= kTileRows * kTileInputs * kMaxTiles, "the CTA's threads store the outputs, one each");
template <class S>
constexpr bool kTakes = S::kGroup == kCodeBlock && S::kSuper == kCodeBlock && !S::kBook && !S::kScaleF32 &&
                        !S::kSubScales && !S::kMins && (S::kBits == 8 || S::kBits == 4);

template <class S>
constexpr int kBlockBytes = kCodeBlock * S::kBits / 8;

// Bytes a staged row of a chunk takes: its 32 blocks' codes, padded so that its words start kCodeWords banks after
// the row before. A fragment load then finds the 8 rows g of a warp in distinct banks (8-bit codes: 2 words a lane,
// so rows 0-3 fill the 32 banks once and 4-7 once more; 4-bit: 1 word a lane, all 8 rows once).
template <class S>
constexpr int kStageStride = (kChunkBlocks * S::kCodeWords + S::kCodeWords) * 4;
static_assert(kChunkBlocks * 8 % 32 == 0 && kChunkBlocks * 4 % 32 == 0, "a chunk's row is whole banks before the pad");

// Halves a staged row of a chunk's scales takes: its 32 blocks' f16 scales and one word of pad, so that the rows'
// words start an odd count of banks apart and a fragment's 8 rows g read 8 banks.
constexpr int kScaleStride = kChunkBlocks + 2;
static_assert(kScaleStride / 2 % 2 == 1, "a staged scale row is an odd count of words");

// A stage: a chunk's codes of the tile's 16 rows, then their scales. Staging the scales with the codes, rather than
// reading the tile's before the first chunk, keeps a CTA's first loads in flight together (the prologue of plain
// loads set a floor of ~1.6x the one-row walk's time, docs/rows.md) and a CTA's shared memory independent of cols.
template <class S>
constexpr int kStageCodeBytes = kTileRows * kStageStride<S>;
template <class S>
constexpr int kStageBytes = kStageCodeBytes<S> + kTileRows * kScaleStride * static_cast<int>(sizeof(__half));
static_assert(kTileRows * kScaleStride * sizeof(__half) % 16 == 0, "the next stage's codes start 16-byte aligned");

// After the stages, the part's sums that the cluster's first CTA reads from the others: at one offset in every CTA of
// the cluster, as a stage's place depends on the CTA's count of chunks.
using PartSums = float[kTileRows][kMaxMmaInputs];
template <class S>
constexpr std::size_t kSharedBytes = static_cast<std::size_t>(kStages) * kStageBytes<S> + sizeof(PartSums);

// The CTA's rows of one chunk (blocks 32 q .. 32 q + 31 of each row, those the row has) into a stage by cp.async,
// codes and scales; rows past the matrix are not loaded (their outputs are walked, never stored: a row's mma
// outputs depend on that row alone). A chunk's blocks are even (gemv_quant_mma_takes), so its scales go in words.
template <class S>
__device__ __forceinline__ void load_chunk(const QuantPlanes& p, int first, int tile_rows, int n_blocks, int q,
                                           unsigned char* stage) {
  constexpr int kPiecesPerBlock = kBlockBytes<S> / 16;  // 16-byte copies: 2 for 8-bit codes, 1 for 4-bit
  const int blocks = min(kChunkBlocks, n_blocks - kChunkBlocks * q), pieces = blocks * kPiecesPerBlock;
  const long row_bytes = static_cast<long>(n_blocks) * kBlockBytes<S>;
  const std::uint8_t* codes = p.codes + first * row_bytes + static_cast<long>(kChunkBlocks) * q * kBlockBytes<S>;
  for (int k = static_cast<int>(threadIdx.x); k < tile_rows * pieces; k += static_cast<int>(blockDim.x)) {
    const int r = k / pieces, at = k % pieces * 16;
    copy_async<16>(stage + r * kStageStride<S> + at, codes + r * row_bytes + at);
  }
  const int words = blocks / 2;
  const __half* d = static_cast<const __half*>(p.d) + static_cast<long>(first) * n_blocks + kChunkBlocks * q;
  __half* scales = reinterpret_cast<__half*>(stage + kStageCodeBytes<S>);
  for (int k = static_cast<int>(threadIdx.x); k < tile_rows * words; k += static_cast<int>(blockDim.x)) {
    const int r = k / words, w = k % words;
    copy_async<4>(scales + r * kScaleStride + 2 * w, d + static_cast<long>(r) * n_blocks + 2 * w);
  }
}

// A thread's outputs: Tiles input tiles of an mma's 4 (weight row g + 8 (e / 2), input 8 tile + 2 t + e % 2).
template <int Tiles>
using Outputs = float[Tiles][4];

// A leaf's block as the activations give it: B's fragment and, for the thread's two outputs of each tile, the
// input's block scale and code sum.
template <int Tiles>
struct BlockInputs {
  unsigned b0[Tiles], b1[Tiles];
  float dx[Tiles][2];
  int xsum[Tiles][2];
};

// What a thread multiplies besides the staged weights and scales: the activations of its B columns and of its
// outputs, each input as the offset of its first block (inputs are `acts.stride` elements apart), so that a chunk's
// leaves can hold their blocks' inputs at once (load_inputs) without a pointer triple an input.
template <class S, int Tiles>
struct Operands {
  StridedQ8 acts;
  int bias_shift;
  int column[Tiles];  // B's column g of each tile: input 8 tile + g (zeros past `inputs`), its first block
  bool column_live[Tiles];
  int x[Tiles][2];    // the inputs of the thread's outputs, 8 tile + 2 t and 8 tile + 2 t + 1: their first blocks
  int g, t;

  // Block b's inputs: the loads of a chunk's leaves issue together, each a dependent L2 round trip otherwise.
  __device__ __forceinline__ void load_inputs(int b, BlockInputs<Tiles>& in) const {
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
      in.b0[tile] = 0u, in.b1[tile] = 0u;
      if (column_live[tile]) column_words(column[tile] + b, in.b0[tile], in.b1[tile]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        in.dx[tile][j] = __ldg(acts.dx + x[tile][j] + b);
        in.xsum[tile][j] = __ldg(acts.sums + x[tile][j] + b);
      }
    }
  }

  // sums += a block's terms, its codes at `block` of the staged rows g and g + 8, its scales at `scales` of the
  // staged scale rows and its inputs `in`: the one-row GEMV's lane step.
  __device__ __forceinline__ void add_block_terms(const unsigned char* block, const __half* scales,
                                                  const BlockInputs<Tiles>& in, Outputs<Tiles>& sums) const {
    unsigned a[4];
    weights(block, a);
    const float row_scale[2] = {__half2float(scales[g * kScaleStride]), __half2float(scales[(g + 8) * kScaleStride])};
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
      int dots[4] = {0, 0, 0, 0};
      mma_s8_k32(dots, a, in.b0[tile], in.b1[tile]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float scale[1] = {row_scale[e / 2]}, no_offset[1] = {0.0f};
        const int dot[1] = {dots[e]}, block_sum[1] = {in.xsum[tile][e % 2]};
        sums[tile][e] = quant_rows::add_block(sums[tile][e], in.dx[tile][e % 2],
                                              quant_rows::block_term<S>(scale, no_offset, dot, block_sum, bias_shift));
      }
    }
  }

  // A's fragment: the thread's 8 k positions of rows g and g + 8 (a dot sums over k in any order, so A and B need
  // only agree): 8-bit codes as bytes 8 t .. 8 t + 7 (shifted by -128, as the integer walk's operand), 4-bit codes
  // as the low and high nibbles of word t (elements 4 t.. and 16 + 4 t..).
  __device__ __forceinline__ void weights(const unsigned char* block, unsigned (&a)[4]) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const unsigned char* row = block + (g + 8 * half) * kStageStride<S>;
      if constexpr (S::kBits == 8) {
        const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * t);
        a[half] = w.x ^ 0x80808080u;
        a[2 + half] = w.y ^ 0x80808080u;
      } else {
        const unsigned w = *reinterpret_cast<const unsigned*>(row + 4 * t);
        a[half] = w & 0x0F0F0F0Fu;
        a[2 + half] = (w >> 4) & 0x0F0F0F0Fu;
      }
    }
  }

  // B's fragment of the input block at `block` (counted from the activations' first): its codes at the k positions
  // weights() gives A.
  __device__ __forceinline__ void column_words(int block, unsigned& b0, unsigned& b1) const {
    const std::int8_t* codes = acts.xq + static_cast<long>(block) * kCodeBlock;
    if constexpr (S::kBits == 8) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(codes) + t);
      b0 = w.x, b1 = w.y;
    } else {
      b0 = __ldg(reinterpret_cast<const unsigned*>(codes) + t);
      b1 = __ldg(reinterpret_cast<const unsigned*>(codes) + 4 + t);
    }
  }
};

template <int Tiles>
__device__ __forceinline__ void add_outputs(Outputs<Tiles>& sums, const Outputs<Tiles>& right) {
#pragma unroll
  for (int tile = 0; tile < Tiles; ++tile) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sums[tile][e] += right[tile][e];
  }
}

// The pairwise tree over the N leaves from `first`: the butterfly's levels for the N lanes of an aligned run of
// bit-reversed positions.
template <int N, int Tiles>
__device__ __forceinline__ void fold_leaves(Outputs<Tiles> (&leaves)[kLeaves], int first, Outputs<Tiles>& sums) {
  if constexpr (N == 1) {
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[tile][e] = leaves[first][tile][e];
    }
  } else {
    Outputs<Tiles> right;
    fold_leaves<N / 2, Tiles>(leaves, first, sums);
    fold_leaves<N / 2, Tiles>(leaves, first + N / 2, right);
    add_outputs<Tiles>(sums, right);
  }
}

// The butterfly's levels above the warps' runs: the tree over N warps' subtrees from warp w of output (r, i).
template <int N, int Inputs>
__device__ __forceinline__ float fold_warps(const float (&subtrees)[kWarps][kTileRows][Inputs], int w, int r, int i) {
  if constexpr (N == 1) {
    return subtrees[w][r][i];
  } else {
    return fold_warps<N / 2>(subtrees, w, r, i) + fold_warps<N / 2>(subtrees, w + N / 2, r, i);
  }
}

// CTAs an SM holds at once, the registers kept to what shared memory allows (4 x kSharedBytes), and the leaves
// whose inputs are asked for together: all of a chunk's at one input tile (64 registers); at two, a leaf at a time
// (80 registers, 3 CTAs: two leaves' inputs spilled at 80, four took 124 registers).
template <int Tiles>
constexpr int kMinCtas = Tiles == 1 ? 4 : 3;
template <int Tiles>
constexpr int kLeavesLoaded = Tiles == 1 ? kLeaves : 1;

// y_i = W x_i for i < inputs over the matrix's 16-row tiles, each output the one-row GEMV's bits
// (gemv_quant_mma.cuh). Split is gemv_quant's warps a row for the matrix (row_split): a cluster of Split CTAs takes a
// tile, CTA `part` the part's 32 lane classes, its chunks 32 blocks apart times Split, each chunk one block of every
// class. Each warp carries kLeaves leaves (an aligned run of bit-reversed positions) across the chunks and folds
// them at the end; the CTA folds the warps' subtrees, and the cluster's first CTA adds the parts in turn, as
// store_row does.
//
// Why a cluster walks several tiles (tile `cluster`, + clusters, ...): a tile is 1-3 chunks a part at the model's
// widths, so a CTA of one tile spent its life waiting for its first stages and folding, and the SM's loads paused
// between the waves of CTAs. Walking its tiles as one sequence of chunks, a CTA asks for the next tile's chunks
// while it computes and folds this one's (its first tile's rows asked into L2 before the producers' wait).
template <class S, int Split, int Tiles>
__global__ void __launch_bounds__(kWarps * 32, kMinCtas<Tiles>)
gemv_quant_mma_kernel(QuantPlanes p, int rows, int cols, int code_bias, StridedQ8 acts, int inputs,
                      float* __restrict__ y) {
  prefetch_constant_rows(p.codes, static_cast<long>(cols / kCodeBlock) * S::kCodeWords * 4,
                         static_cast<long>(blockIdx.x) / Split * kTileRows, kTileRows, rows);
  await_producers();
  release_consumers();
  extern __shared__ __align__(16) unsigned char staged[];
  const int part = static_cast<int>(blockIdx.x) % Split, cluster = static_cast<int>(blockIdx.x) / Split;
  const int clusters = static_cast<int>(gridDim.x) / Split, tiles = (rows + kTileRows - 1) / kTileRows;
  const int n_blocks = cols / kCodeBlock, n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
  const int chunks = part < n_chunks ? (n_chunks - part + Split - 1) / Split : 0;  // a tile's: q = part + Split c
  const int my_tiles = (tiles - cluster + clusters - 1) / clusters;  // the launch starts clusters <= tiles
  const int total = my_tiles * chunks;  // the CTA's chunks in turn: chunk c of its tile j is k = j chunks + c
  const auto load = [&](int k) {
    const int first = (cluster + k / chunks * clusters) * kTileRows;
    load_chunk<S>(p, first, min(kTileRows, rows - first), n_blocks, part + Split * (k % chunks),
                  staged + k % kStages * kStageBytes<S>);
  };
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {  // one commit a stage, loaded or not, so wait_copies counts stages
    if (k < total) load(k);
    commit_copies();
  }

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  // An input's first block; past `inputs` input 0's (never stored, or zeros).
  const auto input = [&](int i) { return static_cast<int>((i < inputs ? i : 0) * (acts.stride / kCodeBlock)); };
  Operands<S, Tiles> operands{acts, (S::kBits == 8 ? 128 : 0) - code_bias, {}, {}, {}, lane >> 2, lane & 3};
#pragma unroll
  for (int tile = 0; tile < Tiles; ++tile) {
    const int base = kTileInputs * tile;
    operands.column[tile] = input(base + operands.g);
    operands.column_live[tile] = base + operands.g < inputs;
    operands.x[tile][0] = input(base + 2 * operands.t);
    operands.x[tile][1] = input(base + 2 * operands.t + 1);
  }
  int lane_class[kLeaves];  // the classes of the warp's leaves: bit-reversed positions kLeaves warp ..
#pragma unroll
  for (int leaf = 0; leaf < kLeaves; ++leaf) {
    lane_class[leaf] = static_cast<int>(__brev(static_cast<unsigned>(kLeaves * warp + leaf)) >> 27);
  }
  constexpr int kInputs = kTileInputs * Tiles;
  const int r = static_cast<int>(threadIdx.x) / kInputs, i = static_cast<int>(threadIdx.x) % kInputs;
  for (int j = 0; j < my_tiles; ++j) {
    const int first = (cluster + j * clusters) * kTileRows, tile_rows = min(kTileRows, rows - first);
    Outputs<Tiles> leaves[kLeaves];
#pragma unroll
    for (int leaf = 0; leaf < kLeaves; ++leaf) {
#pragma unroll
      for (int tile = 0; tile < Tiles; ++tile) {
#pragma unroll
        for (int e = 0; e < 4; ++e) leaves[leaf][tile][e] = 0.0f;
      }
    }
    for (int c = 0; c < chunks; ++c) {
      const int k = j * chunks + c;
      wait_copies<kStages - 2>();  // this thread's copies of chunk k; the barrier: everyone's, and chunk k - 1 done
      __syncthreads();
      if (k + kStages - 1 < total) load(k + kStages - 1);
      commit_copies();
      const int q = part + Split * c;
      const unsigned char* stage = staged + k % kStages * kStageBytes<S>;
      const __half* stage_scales = reinterpret_cast<const __half*>(stage + kStageCodeBytes<S>);
#pragma unroll
      for (int group = 0; group < kLeaves; group += kLeavesLoaded<Tiles>) {
        BlockInputs<Tiles> in[kLeavesLoaded<Tiles>];  // the group's inputs asked for before its first mma
#pragma unroll
        for (int l = 0; l < kLeavesLoaded<Tiles>; ++l) {
          operands.load_inputs(min(kChunkBlocks * q + lane_class[group + l], n_blocks - 1), in[l]);
        }
#pragma unroll
        for (int l = 0; l < kLeavesLoaded<Tiles>; ++l) {
          const int leaf = group + l;
          if (kChunkBlocks * q + lane_class[leaf] < n_blocks) {
            operands.add_block_terms(stage + lane_class[leaf] * kBlockBytes<S>, stage_scales + lane_class[leaf],
                                     in[l], leaves[leaf]);
          }
        }
      }
    }
    // The stage of the tile's last chunk holds the warps' subtrees: no copy lands there until the next chunk's
    // barrier (the next tile's chunks load into the other stages meanwhile), which, like the barrier below at a
    // tile of no chunks, no thread passes before every thread has read this tile's subtrees.
    using Subtrees = float[kWarps][kTileRows][kInputs];
    static_assert(sizeof(Subtrees) <= kStageBytes<S>, "a stage holds the warps' subtrees");
    unsigned char* sums_stage = staged + (chunks > 0 ? (j * chunks + chunks - 1) % kStages : 0) * kStageBytes<S>;
    Subtrees& subtrees = *reinterpret_cast<Subtrees*>(sums_stage);
    __syncthreads();  // every warp past the chunk whose stage this is (and past the last tile's subtrees)
    Outputs<Tiles> sums;
    fold_leaves<kLeaves, Tiles>(leaves, 0, sums);
    const int g = operands.g, t = operands.t;
#pragma unroll
    for (int tile = 0; tile < Tiles; ++tile) {
      const int i0 = kTileInputs * tile + 2 * t;
      subtrees[warp][g][i0] = sums[tile][0];
      subtrees[warp][g][i0 + 1] = sums[tile][1];
      subtrees[warp][g + 8][i0] = sums[tile][2];
      subtrees[warp][g + 8][i0 + 1] = sums[tile][3];
    }
    __syncthreads();
    const bool stored = r < tile_rows && i < inputs;  // threads past the tile's outputs too (r >= 16)
    const float part_sum = r < kTileRows ? fold_warps<kWarps>(subtrees, 0, r, i) : 0.0f;
    if constexpr (Split == 1) {
      if (stored) y[static_cast<long>(i) * rows + first + r] = part_sum;
    } else {  // store_row's sum of the parts in turn, the parts in the cluster's CTAs
      PartSums& part_sums = *reinterpret_cast<PartSums*>(staged + kStages * kStageBytes<S>);
      if (r < kTileRows) part_sums[r][i] = part_sum;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
      __trap();  // no clusters below sm_90: the launcher never runs a split there (gemv_quant_mma_runs)
#else
      namespace cg = cooperative_groups;
      const cg::cluster_group cluster_group = cg::this_cluster();
      cluster_group.sync();  // every part's sums written
      if (part == 0 && stored) {
        float total_sum = 0.0f;
#pragma unroll
        for (int q = 0; q < Split; ++q) total_sum += *cluster_group.map_shared_rank(&part_sums[r][i], q);
        y[static_cast<long>(i) * rows + first + r] = total_sum;
      }
      cluster_group.sync();  // the other CTAs' shared memory stays until the first has read it
#endif
    }
  }
}

// The most CTAs of the kernel resident at once on the current device, whole clusters of Split: the walking CTAs'
// grid (a cluster past them would start only when a resident one has walked all its tiles). Asked once a device.
template <class S, int Split, int Tiles>
cudaError_t resident_ctas(std::size_t shared, int* ctas) {
  const auto kernel = gemv_quant_mma_kernel<S, Split, Tiles>;
  static std::atomic<int> known[kMaxDevicesKnown] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesKnown && known[device].load(std::memory_order_relaxed) > 0) {
    *ctas = known[device].load(std::memory_order_relaxed);
    return cudaSuccess;
  }
  int found = 0;
  if constexpr (Split == 1) {
    int sms = 0, per_sm = 0;
    status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (status == cudaSuccess) {
      status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, shared);
    }
    found = sms * per_sm;
  } else {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim = {static_cast<unsigned>(Split), 1, 1};
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(Split));
    config.blockDim = dim3(kWarps * 32);
    config.dynamicSmemBytes = shared;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    found = clusters * Split;
  }
  if (status != cudaSuccess) return status;
  if (found < Split) return cudaErrorInvalidConfiguration;  // not even one cluster fits
  if (device < kMaxDevicesKnown) known[device].store(found, std::memory_order_relaxed);
  *ctas = found;
  return cudaSuccess;
}

template <class S, int Split, int Tiles>
cudaError_t launch_walk(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                        const StridedQ8& acts, float* y, cudaStream_t stream) {
  const auto kernel = gemv_quant_mma_kernel<S, Split, Tiles>;
  const std::size_t shared = kSharedBytes<S>;
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  int resident = 0;
  if (status == cudaSuccess) status = resident_ctas<S, Split, Tiles>(shared, &resident);
  if (status != cudaSuccess) return status;
  const long tiles = (rows + kTileRows - 1) / kTileRows;
  const long ctas = std::min(tiles, static_cast<long>(resident / Split)) * Split;
  return launch_clustered(kernel, dim3(static_cast<unsigned>(ctas)), kWarps * 32, shared, stream,
                          static_cast<unsigned>(Split), planes, rows, cols, form.code_bias, acts, inputs, y);
}

template <class S, int Tiles>
cudaError_t launch_tiles(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                         const StridedQ8& acts, float* y, cudaStream_t stream) {
  const int split = row_split(rows);
  return split == 1   ? launch_walk<S, 1, Tiles>(form, planes, rows, cols, inputs, acts, y, stream)
         : split == 2 ? launch_walk<S, 2, Tiles>(form, planes, rows, cols, inputs, acts, y, stream)
                      : launch_walk<S, 4, Tiles>(form, planes, rows, cols, inputs, acts, y, stream);
}

template <class S>
cudaError_t launch_shape(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                         const StridedQ8& acts, float* y, cudaStream_t stream) {
  static_assert(kMaxTiles == 2, "a kernel for one input tile and one for two");
  return inputs <= kTileInputs ? launch_tiles<S, 1>(form, planes, rows, cols, inputs, acts, y, stream)
                               : launch_tiles<S, 2>(form, planes, rows, cols, inputs, acts, y, stream);
}

}  // namespace

bool gemv_quant_mma_runs(const QuantForm& form, int rows, int cols) {
  if (!gemv_quant_mma_takes(form, cols)) return false;
  if (row_split(rows) == 1) return true;
  bool clusters = false;  // compute capability >= 9.0, as programmatic launch asks
  return launch_detail::programmatic_launch_allowed(&clusters) == cudaSuccess && clusters;
}

bool gemv_quant_mma_takes(const QuantForm& form, int cols) {
  bool takes = false;
  KnownShapes::visit(form, [&](auto shape) {
    using S = decltype(shape);
    if constexpr (kTakes<S>) {
      takes = cols > 0 && cols % (2 * kCodeBlock) == 0;
    }
  });
  return takes;
}

bool gemv_quant_mma_aligned(const QuantPlanes& planes) {
  return reinterpret_cast<std::uintptr_t>(planes.d) % sizeof(unsigned) == 0;
}

cudaError_t gemv_quant_mma(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                           const StridedQ8& acts, float* y, cudaStream_t stream) {
  if (rows <= 0 || inputs < 1 || inputs > kMaxMmaInputs || !gemv_quant_mma_runs(form, rows, cols) ||
      !gemv_quant_mma_aligned(planes)) {
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
