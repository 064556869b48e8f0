// The quantized GEMV's row dot (gemv_quant.cu) for every shape of quant_shapes.cuh, shared with the kernels
// that fuse a GEMV into their own launch (router_publish.cu, hc_read.cu): one definition, so a fused product is
// the same bits as gemv_quant's.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "int8_dot.cuh"
#include "quant_shapes.cuh"
#include "strata/forms.hpp"

namespace strata::kernels {
namespace quant_rows {

template <class S>
__device__ __forceinline__ void load_codes(const std::uint8_t* block_codes, unsigned (&w)[S::kCodeWords]) {
  if constexpr (S::kCodeWords == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(block_codes));
    w[0] = v.x, w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < S::kCodeWords / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(block_codes) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

// 4 codes of one word, as the signed bytes __dp4a multiplies: table values, or the codes themselves when
// they fit int8 (2 and 4 bits); 8-bit codes are shifted by -128 (flip of the top bit) and corrected later.
template <class S>
__device__ __forceinline__ int operand(unsigned codes4, const ValueTable& book) {
  if constexpr (S::kBook) return lookup16(codes4, book);
  else if constexpr (S::kBits == 8) return static_cast<int>(codes4 ^ 0x80808080u);
  else return static_cast<int>(codes4);
}

// Σ operand * xq per group of one block. x word k holds elements 4k..4k+3 of the block.
template <class S>
__device__ __forceinline__ void block_dots(const unsigned (&c)[S::kCodeWords], const int (&x)[8],
                                           const ValueTable& book, int (&dot)[S::kGroupsPerBlock]) {
#pragma unroll
  for (int g = 0; g < S::kGroupsPerBlock; ++g) dot[g] = 0;
  constexpr int kLastGroup = S::kGroupsPerBlock - 1;
  if constexpr (S::kBits == 8) {  // word k: codes 4k..4k+3
#pragma unroll
    for (int k = 0; k < 8; ++k) dot[k * 4 / S::kGroup] = __dp4a(operand<S>(c[k], book), x[k], dot[k * 4 / S::kGroup]);
  } else if constexpr (S::kBits == 4) {  // word k: codes 4k.. (low nibbles), 16 + 4k.. (high nibbles)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      dot[0] = __dp4a(operand<S>(c[k] & 0x0F0F0F0Fu, book), x[k], dot[0]);
      dot[kLastGroup] = __dp4a(operand<S>((c[k] >> 4) & 0x0F0F0F0Fu, book), x[4 + k], dot[kLastGroup]);
    }
  } else {  // 2 bits, word h: bits 2i of its bytes hold codes 8i + 4h ..
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * i + h;
        const int g = k * 4 / S::kGroup;
        dot[g] = __dp4a(operand<S>((c[h] >> (2 * i)) & 0x03030303u, book), x[k], dot[g]);
      }
    }
  }
}

// A block's 32 q8 codes, loaded as two int4, as the 8 words block_dots takes.
__device__ __forceinline__ void code_words(const int4& lo, const int4& hi, int (&x)[8]) {
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
  x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

// The float part of a row dot, in the one order every kernel of a quantized row keeps, so that a product's bits do
// not depend on which kernel ran it (the GEMVs, the kernels that fuse one, the tensor-core GEMV of a step's rows,
// gemv_quant_mma.cu): a block's term is its groups' scaled integer dots (and mins) added in turn, and a lane's sum
// adds the activation's scale times it. Each step is a written fma: nvcc contracts a * b + c by itself, but where
// it did so would then be the compiler's choice in each kernel, not the source's.
template <class S>
__device__ __forceinline__ float block_term(const float (&scale)[S::kGroupsPerBlock],
                                            const float (&offset)[S::kGroupsPerBlock],
                                            const int (&dot)[S::kGroupsPerBlock],
                                            const int (&xsum)[S::kGroupsPerBlock], int bias_shift) {
  float term = 0.0f;
#pragma unroll
  for (int g = 0; g < S::kGroupsPerBlock; ++g) {
    term = __fmaf_rn(scale[g], static_cast<float>(dot[g] + bias_shift * xsum[g]), term);
    if constexpr (S::kMins) term = __fmaf_rn(offset[g], static_cast<float>(xsum[g]), term);
  }
  return term;
}

__device__ __forceinline__ float add_block(float acc, float dx, float term) { return __fmaf_rn(dx, term, acc); }

}  // namespace quant_rows

// q8_32(x) (xq, dx, sums) as a row dot reads it: from global memory through the read-only path (the GEMVs), or
// staged in shared memory by the kernel that reads it (hc_read.cu). xq 16-byte aligned.
struct GlobalQ8 {
  const std::int8_t* __restrict__ xq;
  const float* __restrict__ dx;
  const std::int32_t* __restrict__ sums;
  // Code block b's 32 codes as 8 words, word k holding codes 4k .. 4k + 3.
  __device__ __forceinline__ void words(int b, int (&x)[8]) const {
    const int4* block = reinterpret_cast<const int4*>(xq + b * kCodeBlock);
    quant_rows::code_words(__ldg(block), __ldg(block + 1), x);
  }
  __device__ __forceinline__ float scale(int b) const { return __ldg(dx + b); }
  __device__ __forceinline__ int sum(int b) const { return __ldg(sums + b); }
};
struct SharedQ8 {
  const std::int8_t* xq;
  const float* dx;
  const std::int32_t* sums;
  __device__ __forceinline__ void words(int b, int (&x)[8]) const {
    const int4* block = reinterpret_cast<const int4*>(xq + b * kCodeBlock);
    quant_rows::code_words(block[0], block[1], x);
  }
  __device__ __forceinline__ float scale(int b) const { return dx[b]; }
  __device__ __forceinline__ int sum(int b) const { return sums[b]; }
};

// Several activations of one shape, the `inputs` rows of a multi-input GEMV: input i's q8_32 form starts
// i * stride elements after input 0's (stride a multiple of 32).
struct StridedQ8 {
  const std::int8_t* __restrict__ xq;
  const float* __restrict__ dx;
  const std::int32_t* __restrict__ sums;
  long stride;
  __device__ __forceinline__ GlobalQ8 operator[](int i) const {
    const long at = i * stride;
    return GlobalQ8{xq + at, dx + at / kCodeBlock, sums + at / kCodeBlock};
  }
};

// One activation as the N = 1 case of quant_row_partials reads it.
template <class X>
struct OneQ8 {
  X x;
  __device__ __forceinline__ const X& operator[](int) const { return x; }
};

// This lane's shares of the dots of the planes' rows `row[0 .. R - 1]` [cols] with the first `inputs` (<= N)
// activations acts[0 .. inputs - 1] (each a GlobalQ8 or SharedQ8) into acc[r][0 .. inputs - 1]: code blocks slot,
// slot + slots, ..., before the caller's reduction over the slots (a GEMV warp `part` of `split` per row is slots
// part * 32 + lane of 32 * split). Each block's codes and scales are loaded and decoded once for every input, each
// input's codes once for every row (at 8 inputs a lane would otherwise load about 9x a weight block's bytes from
// L1 for each block of each row), and each (row, input) sum is taken in the order of the one-row, one-input walk,
// so it is, bit for bit, what that walk over row[r] and acts[i] alone gives. A spare lane (live false) walks no
// blocks.
template <class S, int N, int R, class Acts>
__device__ __forceinline__ void quant_rows_partials(const QuantPlanes& p, const long (&row)[R], bool live, int cols,
                                                    int code_bias, const ValueTable& book, const Acts& acts, int inputs,
                                                    int slot, int slots, float (&acc)[R][N]) {
  using namespace quant_rows;
  const int n_blocks = cols / kCodeBlock, n_super = cols / S::kSuper, n_group = cols / S::kGroup;
  // Σ v xq = Σ operand xq + bias_shift Σ xq: the 8-bit operand is code - 128, the others code (or table).
  const int bias_shift = S::kBook ? 0 : (S::kBits == 8 ? 128 : 0) - code_bias;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[r][i] = 0.0f;
  }
  for (int b = live ? slot : n_blocks; b < n_blocks; b += slots) {
    unsigned c[R][S::kCodeWords];
    float scale[R][S::kGroupsPerBlock], offset[R][S::kGroupsPerBlock];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      load_codes<S>(p.codes + (row[r] * n_blocks + b) * S::kCodeWords * 4, c[r]);
      const long super_index = row[r] * n_super + b * kCodeBlock / S::kSuper;
      const float d = S::kScaleF32 ? __ldg(static_cast<const float*>(p.d) + super_index)
                                   : __half2float(__ldg(static_cast<const __half*>(p.d) + super_index));
      float m = 0.0f;
      if constexpr (S::kMins) m = __half2float(__ushort_as_half(__ldg(p.mins + super_index)));
#pragma unroll
      for (int g = 0; g < S::kGroupsPerBlock; ++g) {
        const long group_index = row[r] * n_group + b * S::kGroupsPerBlock + g;
        scale[r][g] = d;
        offset[r][g] = m;
        if constexpr (S::kSubScales) scale[r][g] = d * static_cast<float>(__ldg(p.sub_scales + group_index));
        if constexpr (S::kMins && S::kSubScales) offset[r][g] = m * static_cast<float>(__ldg(p.sub_mins + group_index));
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i >= inputs) break;
      const auto act = acts[i];
      int x[8];
      act.words(b, x);
      int xsum[S::kGroupsPerBlock];
#pragma unroll
      for (int g = 0; g < S::kGroupsPerBlock; ++g) {
        if constexpr (S::kGroupsPerBlock == 1) {
          xsum[g] = act.sum(b);
        } else {
          xsum[g] = 0;
#pragma unroll
          for (int k = 0; k < S::kGroup / 4; ++k) {
            xsum[g] = __dp4a(static_cast<int>(kByteOnes), x[g * S::kGroup / 4 + k], xsum[g]);
          }
        }
      }
      const float dx = act.scale(b);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        int dot[S::kGroupsPerBlock];
        block_dots<S>(c[r], x, book, dot);
        acc[r][i] = add_block(acc[r][i], dx, block_term<S>(scale[r], offset[r], dot, xsum, bias_shift));
      }
    }
  }
}

// The one-activation walk (GlobalQ8, SharedQ8): what the GEMVs and the kernels that fuse one run per row.
template <class S, class X>
__device__ __forceinline__ float quant_row_partial(const QuantPlanes& p, long row, bool live, int cols, int code_bias,
                                                   const ValueTable& book, const X& act, int slot, int slots) {
  const long rows[1] = {row};
  float acc[1][1];
  quant_rows_partials<S, 1, 1>(p, rows, live, cols, code_bias, book, OneQ8<X>{act}, 1, slot, slots, acc);
  return acc[0][0];
}

}  // namespace strata::kernels
