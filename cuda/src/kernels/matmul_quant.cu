// The matrix product of the quantized forms (matmul.cuh): int8 tensor-core products of the weights' signed
// values v with q8_32 activations, one 32-column block per pipeline stage. Each block's group sums Σ v xq come
// out of the mma exact, and are scaled as the GEMV scales them: Σ_blocks dx * Σ_groups (d s Σ v xq + m sm Σ xq).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "int8_dot.cuh"
#include "launch.cuh"
#include "matmul.cuh"
#include "matmul_tiles.cuh"
#include "quant_shapes.cuh"

namespace strata::kernels {
namespace {

// The int32 accumulators start at the bits of the float32 1.5 * 2^23: adding any |sum| < 2^22 leaves bits
// that read, as a float32, 1.5 * 2^23 + sum exactly, so one float subtraction turns an mma's exact sum
// (|Σ v xq| <= 32 * 128 * 127 < 2^19) into a float32 at full rate, bypassing the slow int -> float unit.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;
constexpr unsigned kOnes = 0x01010101u;

__device__ __forceinline__ float magic_to_float(int bits) { return __int_as_float(bits) - kMagic; }

// Shared memory of one pipeline stage: one 32-column block of the CTA's weight rows (codes as stored) and X
// rows (xq), the weight rows' group scales and offsets, and the X rows' block scales.
template <class S>
struct alignas(16) Stage {
  // Words per row: lane 4 g + t of a fragment load reads word t (and 4 + t) of row g, and the 8 rows must fall
  // in distinct banks: 12-word rows put row g at bank 12 g mod 32, 4-word rows at 4 g; in 2-word rows lanes t
  // and t + 2 read the same word.
  static constexpr int kCodeStride = S::kBits == 8 ? 12 : S::kBits == 4 ? 4 : 2;
  static constexpr int kXqStride = 12;
  unsigned codes[kMatmulWeightTile * kCodeStride];
  unsigned xq[kMatmulRowTile * kXqStride];
  float2 scales[S::kGroupsPerBlock][kMatmulWeightTile];  // (d * sub_scale, mins * sub_min) of each weight row
  float dx[kMatmulRowTile];
};

// As many stages as 48 KiB of static shared memory holds, at most 4.
template <class S>
constexpr int kStages = static_cast<int>(std::min<std::size_t>(4, (48 * 1024 - 16) / sizeof(Stage<S>)));

// The arguments of one launch.
struct QuantMatmulArgs {
  QuantPlanes planes;
  int rows = 0, cols = 0;
  unsigned bias_add = 0;  // (128 - code_bias) in every byte: (code + bias_add) ^ 0x80 is the int8 code - code_bias
  ValueTable book;
  MatmulRows x_rows;
  MatmulGroups groups;
  const std::int8_t* xq = nullptr;
  const float* dx = nullptr;
  float* y = nullptr;
};

// One weight row's group scale and offset inputs for one block, as loaded: held in registers while a block
// is multiplied, converted into the stage only after, so the loads' latency hides behind the mma work.
struct RawScale {
  unsigned d = 0;          // float16 or float32 bits
  int sub_scale = 1;
  unsigned short min = 0;  // float16 bits
  int sub_min = 1;
};

// Which global data this thread moves into each stage: a 16-byte piece of codes (8-byte for 2-bit codes)
// of one weight row, a 16-byte half of one X row's xq, one X row's dx, one weight row's group scale.
template <class S>
class StageLoader {
 public:
  __device__ StageLoader(const QuantMatmulArgs& a, const RowTile& tile, int w0) : planes_(a.planes) {
    const int tid = static_cast<int>(threadIdx.x);
    const auto weight_row = [&](int r) { return tile.matrix_row + min(w0 + r, a.rows - 1); };
    const auto x_row = [&](int r) { return static_cast<long>(tile.first + min(r, tile.count - 1)); };
    const long row_bytes = static_cast<long>(a.cols) * S::kBits / 8;
    copies_codes_ = S::kBits == 8 || tid < kMatmulWeightTile;
    const int code_row = S::kBits == 8 ? tid / 2 : tid % kMatmulWeightTile, code_piece = S::kBits == 8 ? tid % 2 : 0;
    codes_from_ = a.planes.codes + weight_row(code_row) * row_bytes + code_piece * 16;
    codes_to_ = code_row * Stage<S>::kCodeStride + code_piece * 4;
    copies_xq_ = tid >= kMatmulThreads / 2;
    const int xq_chunk = tid % (kMatmulThreads / 2);
    xq_from_ = a.xq + x_row(xq_chunk / 2) * a.x_rows.x_stride + xq_chunk % 2 * 16;
    xq_to_ = xq_chunk / 2 * Stage<S>::kXqStride + xq_chunk % 2 * 4;
    copies_dx_ = tid < kMatmulRowTile;
    dx_from_ = a.dx + x_row(tid) * (a.x_rows.x_stride / kCodeBlock);
    stages_scale_ = tid < kMatmulWeightTile * S::kGroupsPerBlock;
    scale_row_ = weight_row(tid % kMatmulWeightTile);
    scale_group_ = tid / kMatmulWeightTile;
    n_super_ = a.cols / S::kSuper;
    n_group_ = a.cols / S::kGroup;
  }

  // Starts the copies of block b into `stage`.
  __device__ void copy(Stage<S>& stage, int b) const {
    if (copies_codes_) {
      constexpr int kBytes = S::kBits == 2 ? 8 : 16;
      copy_async<kBytes>(stage.codes + codes_to_, codes_from_ + static_cast<long>(b) * S::kCodeWords * 4);
    }
    if (copies_xq_) copy_async<16>(stage.xq + xq_to_, xq_from_ + b * kCodeBlock);
    if (copies_dx_) copy_async<4>(stage.dx + threadIdx.x, dx_from_ + b);
  }

  // Issues the loads of this thread's group scale inputs of block b.
  __device__ RawScale load_scale(int b) const {
    RawScale raw;
    if (!stages_scale_) return raw;
    const long super = scale_row_ * n_super_ + b * kCodeBlock / S::kSuper;
    const long group = scale_row_ * n_group_ + b * S::kGroupsPerBlock + scale_group_;
    if constexpr (S::kScaleF32) raw.d = __ldg(static_cast<const unsigned*>(planes_.d) + super);
    else raw.d = __ldg(static_cast<const unsigned short*>(planes_.d) + super);
    if constexpr (S::kSubScales) raw.sub_scale = __ldg(planes_.sub_scales + group);
    if constexpr (S::kMins) raw.min = __ldg(planes_.mins + super);
    if constexpr (S::kMins && S::kSubScales) raw.sub_min = __ldg(planes_.sub_mins + group);
    return raw;
  }

  // The float32 scale d * s and offset m * sm, computed as the GEMV computes them.
  __device__ void store_scale(Stage<S>& stage, const RawScale& raw) const {
    if (!stages_scale_) return;
    const float d = S::kScaleF32 ? __uint_as_float(raw.d) : __half2float(__ushort_as_half(raw.d));
    float2 v = make_float2(S::kSubScales ? d * static_cast<float>(raw.sub_scale) : d, 0.0f);
    if constexpr (S::kMins) {
      const float m = __half2float(__ushort_as_half(raw.min));
      v.y = S::kSubScales ? m * static_cast<float>(raw.sub_min) : m;
    }
    stage.scales[scale_group_][threadIdx.x % kMatmulWeightTile] = v;
  }

 private:
  QuantPlanes planes_;
  const std::uint8_t* codes_from_;
  const std::int8_t* xq_from_;
  const float* dx_from_;
  long scale_row_;
  int codes_to_, xq_to_, scale_group_, n_super_, n_group_;
  bool copies_codes_, copies_xq_, copies_dx_, stages_scale_;
};

// The A fragment of weight rows r and r + 8 of a stage's block: words 0, 1 hold the int8 values of codes 4 t ..
// 4 t + 3 of rows r and r + 8, words 2, 3 those of codes 16 + 4 t .. (docs/forms.md's packing puts each word's
// 4 codes in one 32-bit word of every code width).
template <class S>
__device__ __forceinline__ void weight_operand(const Stage<S>& stage, int r, int t, const ValueTable& book,
                                               unsigned bias_add, unsigned (&a)[4]) {
  const unsigned* row = stage.codes + r * Stage<S>::kCodeStride;
  const unsigned* row8 = row + 8 * Stage<S>::kCodeStride;
  unsigned c[4];
  if constexpr (S::kBits == 8) {  // byte j: code j
    c[0] = row[t], c[1] = row8[t], c[2] = row[4 + t], c[3] = row8[4 + t];
  } else if constexpr (S::kBits == 4) {  // byte j: code j (low nibble), code j + 16 (high nibble)
    const unsigned w = row[t], w8 = row8[t];
    c[0] = w & 0x0F0F0F0Fu, c[1] = w8 & 0x0F0F0F0Fu, c[2] = (w >> 4) & 0x0F0F0F0Fu, c[3] = (w8 >> 4) & 0x0F0F0F0Fu;
  } else {  // word h, bits 2 i of its bytes: codes 8 i + 4 h ..; codes 4 t .. are word t % 2 at i = t / 2
    const int shift = 2 * (t >> 1);
    const unsigned w = row[t & 1], w8 = row8[t & 1];
    c[0] = (w >> shift) & 0x03030303u, c[1] = (w8 >> shift) & 0x03030303u;
    c[2] = (w >> (shift + 4)) & 0x03030303u, c[3] = (w8 >> (shift + 4)) & 0x03030303u;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // Adding 128 - code_bias carries into no other byte (every v fits int8), and the xor subtracts the 128.
    a[k] = S::kBook ? static_cast<unsigned>(lookup16(c[k], book)) : (c[k] + bias_add) ^ 0x80808080u;
  }
}

// Per group of the block, the float32 of A B for one mma tile: f[q][e] for group q, accumulator element e.
template <class S>
__device__ __forceinline__ void group_products(const unsigned (&a)[4], const unsigned (&b)[2],
                                               float (&f)[S::kGroupsPerBlock][4]) {
  int d[S::kGroupsPerBlock][4];
#pragma unroll
  for (int q = 0; q < S::kGroupsPerBlock; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[q][e] = kMagicBits;
  }
  if constexpr (S::kGroupsPerBlock == 1) {
    mma_s8_k32(d[0], a, b[0], b[1]);
  } else {  // group 0 is columns 0..15: words 0, 1 of A and 0 of B; group 1 the others
    mma_s8_k16(d[0], a[0], a[1], b[0]);
    mma_s8_k16(d[1], a[2], a[3], b[1]);
  }
#pragma unroll
  for (int q = 0; q < S::kGroupsPerBlock; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f[q][e] = magic_to_float(d[q][e]);
  }
}

// Σ xq per group of X rows 2 t and 2 t + 1 of an mma tile, for the offsets: the same mma with every weight 1.
template <class S>
__device__ __forceinline__ void group_sums(const unsigned (&b)[2], float (&sums)[S::kGroupsPerBlock][2]) {
  const unsigned ones[4] = {kOnes, kOnes, kOnes, kOnes};
  float f[S::kGroupsPerBlock][4];
  group_products<S>(ones, b, f);
#pragma unroll
  for (int q = 0; q < S::kGroupsPerBlock; ++q) sums[q][0] = f[q][0], sums[q][1] = f[q][1];
}

// acc += this warp's outputs of one block in `stage`.
template <class S>
__device__ __forceinline__ void multiply_block(const Stage<S>& stage, const ValueTable& book, unsigned bias_add,
                                               WarpAccumulator& acc) {
  constexpr int kGroups = S::kGroupsPerBlock;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int w_warp = warp % kWarpsAlongWeights * 32, x_warp = warp / kWarpsAlongWeights * 32;
  unsigned b[kMmaRowTiles][2];  // B fragment: X row g, columns 4 t .. 4 t + 3 and 16 + 4 t ..
  float2 dx[kMmaRowTiles];      // X rows 2 t, 2 t + 1
  float sums[kMmaRowTiles][kGroups][2];
#pragma unroll
  for (int j = 0; j < kMmaRowTiles; ++j) {
    const unsigned* x_row = stage.xq + (x_warp + 8 * j + g) * Stage<S>::kXqStride;
    b[j][0] = x_row[t], b[j][1] = x_row[4 + t];
    dx[j] = *reinterpret_cast<const float2*>(stage.dx + x_warp + 8 * j + 2 * t);
    if constexpr (S::kMins) group_sums<S>(b[j], sums[j]);
  }
#pragma unroll
  for (int i = 0; i < kMmaWeightTiles; ++i) {
    const int r = w_warp + 16 * i + g;
    unsigned a[4];
    weight_operand<S>(stage, r, t, book, bias_add, a);
    float2 scale[kGroups][2];  // weight rows r, r + 8
#pragma unroll
    for (int q = 0; q < kGroups; ++q) scale[q][0] = stage.scales[q][r], scale[q][1] = stage.scales[q][r + 8];
#pragma unroll
    for (int j = 0; j < kMmaRowTiles; ++j) {
      float f[kGroups][4];
      group_products<S>(a, b[j], f);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int wr = e / 2, xr = e % 2;
        float term;
        if constexpr (S::kMins) term = fmaf(scale[0][wr].x, f[0][e], scale[0][wr].y * sums[j][0][xr]);
        else term = scale[0][wr].x * f[0][e];
#pragma unroll
        for (int q = 1; q < kGroups; ++q) {
          term = fmaf(scale[q][wr].x, f[q][e], term);
          if constexpr (S::kMins) term = fmaf(scale[q][wr].y, sums[j][q][xr], term);
        }
        acc[i][j][e] = fmaf(xr ? dx[j].y : dx[j].x, term, acc[i][j][e]);
      }
    }
  }
}

template <class S>
__global__ void __launch_bounds__(kMatmulThreads, 2) matmul_quant_kernel(QuantMatmulArgs args) {
  await_producers();
  release_consumers();
  const RowTile tile = find_row_tile(args.x_rows, args.groups, args.rows);
  if (tile.count <= 0) return;
  constexpr int kDepth = kStages<S>;
  __shared__ Stage<S> stages[kDepth];
  const int w0 = static_cast<int>(blockIdx.x) * kMatmulWeightTile;
  const StageLoader<S> loader(args, tile, w0);
  const int n_blocks = args.cols / kCodeBlock;
  for (int s = 0; s < kDepth - 1; ++s) {
    if (s < n_blocks) {
      loader.copy(stages[s], s);
      loader.store_scale(stages[s], loader.load_scale(s));
    }
    commit_copies();  // one group per stage, empty or not, so that wait_copies counts blocks
  }
  WarpAccumulator acc = {};
  for (int b = 0; b < n_blocks; ++b) {
    const int ahead = b + kDepth - 1;
    const bool prefetch = ahead < n_blocks;
    RawScale raw;
    if (prefetch) raw = loader.load_scale(ahead);
    wait_copies<kDepth - 2>();  // block b's copies are done (this thread's)
    __syncthreads();            // ... and everyone's; and every warp is done with block b - 1, whose stage is reused
    if (prefetch) loader.copy(stages[ahead % kDepth], ahead);
    commit_copies();
    multiply_block<S>(stages[b % kDepth], args.book, args.bias_add, acc);
    if (prefetch) loader.store_scale(stages[ahead % kDepth], raw);
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  store_outputs(acc, w0 + warp % kWarpsAlongWeights * 32, warp / kWarpsAlongWeights * 32, args.rows, tile,
                args.x_rows.y_stride, args.y);
}

cudaError_t launch_form(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                        const MatmulRows& x_rows, const MatmulGroups* groups, const std::int8_t* xq, const float* dx,
                        float* y, cudaStream_t stream) {
  if (!valid_rows(rows, cols, x_rows, groups) || form.super_size <= 0 || cols % form.super_size != 0 ||
      x_rows.x_stride % kCodeBlock != 0) {
    return cudaErrorInvalidValue;
  }
  const unsigned alignment = form.code_bits == 2 ? 8u : 16u;
  if (reinterpret_cast<std::uintptr_t>(planes.codes) % alignment != 0 ||
      reinterpret_cast<std::uintptr_t>(xq) % 16 != 0) {
    return cudaErrorMisalignedAddress;
  }
  QuantMatmulArgs args;
  args.planes = planes;
  args.rows = rows, args.cols = cols;
  args.bias_add = ((128u - static_cast<unsigned>(form.code_bias)) & 0xFFu) * kOnes;
  args.book = value_table(codebook_values(form.codebook));
  args.x_rows = x_rows;
  if (groups != nullptr) args.groups = *groups;
  args.xq = xq, args.dx = dx, args.y = y;
  const dim3 grid = matmul_grid(rows, x_rows, groups);
  cudaError_t status = cudaErrorInvalidValue;
  KnownShapes::visit(form, [&](auto shape) {
    status = launch(matmul_quant_kernel<decltype(shape)>, grid, kMatmulThreads, 0, stream, args);
  });
  return status;
}

}  // namespace

bool matmul_quant_supports(const QuantForm& form) { return KnownShapes::contains(form); }

cudaError_t matmul_quant(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                         const MatmulRows& x_rows, const std::int8_t* xq, const float* dx, float* y,
                         cudaStream_t stream) {
  return launch_form(form, planes, rows, cols, x_rows, nullptr, xq, dx, y, stream);
}

cudaError_t matmul_quant_grouped(const QuantForm& form, const QuantPlanes& stack, int rows, int cols,
                                 const MatmulRows& x_rows, const MatmulGroups& groups, const std::int8_t* xq,
                                 const float* dx, float* y, cudaStream_t stream) {
  return launch_form(form, stack, rows, cols, x_rows, &groups, xq, dx, y, stream);
}

}  // namespace strata::kernels
