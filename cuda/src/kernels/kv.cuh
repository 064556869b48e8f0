// Paged attention KV cache: layout, row append and element reads for every KV format (strata/kv_format.hpp).
// Device helpers (and kv_half, which places a half in its arena region); the attention kernels use them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kv_rotation.cuh"
#include "strata/kv_format.hpp"

namespace strata::kernels {

// One half of a layer's cache: its keys or its values. Element (row r, dim i) is, by codes:
//   Bf16: data[r * head_dim + i] as bf16.
//   Int8: d * code, code = data[r * head_dim + i] (int8), d = scale[(r * head_dim + i) / 32].
//   Q4:   d * code, code = nibble (r * head_dim + i) of data minus 8 (byte j holds elements 2j in its low and
//         2j + 1 in its high nibble), d as for Int8; the element of the rotated row (kv_rotation.cuh).
struct KvHalf {
  KvCodes codes = KvCodes::Bf16;
  void* data = nullptr;
  __half* scale = nullptr;  // Int8 and Q4: [pages][n_head_kv][page_size][head_dim / 32]
};

// The half of `elements` elements whose arena region starts at `region`: its codes, then its scales
// (session_layout.cpp sizes the region with the same kv_format.hpp functions).
inline KvHalf kv_half(KvCodes codes, void* region, std::size_t elements) {
  KvHalf half{codes, region, nullptr};
  if (codes != KvCodes::Bf16)
    half.scale = reinterpret_cast<__half*>(static_cast<char*>(region) + kv_code_bytes(codes, elements));
  return half;
}

// A Q4 half holds rows in the rotated basis: attention rotates q (kv_query_basis) and its output
// (kv_output_basis) to match, which is exact because the rotation is orthonormal and its own inverse.
__host__ __device__ constexpr bool kv_rotated(KvCodes codes) { return codes == KvCodes::Q4; }

// One attention layer's cache. Physical page p holds, for each kv head, page_size token rows of head_dim:
// element (token t, head j, dim i) lives in page page_table[t / page_size] at
// ((p * n_head_kv + j) * page_size + t % page_size) * head_dim + i. Pages hold whole QSA blocks.
struct PagedKv {
  KvHalf keys, values;
  int n_head_kv = 0;
  int head_dim = 0;        // a multiple of 32
  int page_size = 0;       // tokens per page, a multiple of 4
  int max_pages = 0;       // entries of page_table
  const int* page_table = nullptr;  // device [max_pages]: logical page -> physical page
};

// Index of the row (token, head) counted in rows of head_dim elements.
__device__ __forceinline__ long kv_row(const PagedKv& kv, int token, int head) {
  const long page = kv.page_table[token / kv.page_size];
  return (page * kv.n_head_kv + head) * kv.page_size + token % kv.page_size;
}

// Element i of row `row` of the keys or the values, in the half's basis (rotated for Q4).
__device__ __forceinline__ float kv_load(const PagedKv& kv, bool value, long row, int i) {
  const KvHalf& half = value ? kv.values : kv.keys;
  const long at = row * kv.head_dim + i;
  if (half.codes == KvCodes::Bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(half.data)[at]);
  const float d = __half2float(half.scale[at / kKvGroup]);  // head_dim is a multiple of the group
  if (half.codes == KvCodes::Int8) return d * static_cast<float>(static_cast<const signed char*>(half.data)[at]);
  const unsigned pair = static_cast<const unsigned char*>(half.data)[at >> 1];
  return d * static_cast<float>(static_cast<int>((at & 1) ? pair >> 4 : pair & 15u) - 8);
}

// Up to kChunks runs of 4 elements of one row of a half, fetched with one load each (and one load of the run's
// scale) before any is decoded: a kernel fetches the keys and the values of its tokens this way so that all
// their loads are in flight together. Run j starts at element 4 * (lane + lanes * j) of the row; runs at or past
// head_dim, and every run of row -1 (no token), are zeros. A run is one aligned 8-, 4- or 2-byte load, as halves
// start 8-byte aligned: arena regions are, and a half placed right after another (prompt_program) is too, the
// other holding pages of a multiple of 4 rows of whole 32-element groups (a multiple of 128 elements).
template <int kChunks>
struct KvChunks {
  uint2 bits[kChunks];             // Bf16: 4 values; Int8: 4 codes in .x; Q4: 4 nibbles in .x's low 16 bits
  unsigned short scale[kChunks];   // fp16 bits of the run's group scale (Int8 and Q4)
};

template <int kChunks>
__device__ __forceinline__ void kv_fetch_chunks(const KvHalf& half, int head_dim, long row, int lane, int lanes,
                                                KvChunks<kChunks>& c) {
  const long base = row * head_dim;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int e = 4 * (lane + lanes * j);
    c.bits[j] = make_uint2(0u, 0u);
    c.scale[j] = 0;
    if (row < 0 || e >= head_dim) continue;
    const long at = base + e;
    if (half.codes == KvCodes::Bf16) {
      c.bits[j] = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(half.data) + at);
      continue;
    }
    c.scale[j] = __half_as_ushort(half.scale[at / kKvGroup]);
    if (half.codes == KvCodes::Int8)
      c.bits[j].x = *reinterpret_cast<const unsigned*>(static_cast<const signed char*>(half.data) + at);
    else
      c.bits[j].x = *reinterpret_cast<const unsigned short*>(static_cast<const unsigned char*>(half.data) + at / 2);
  }
}

// Run j of fetched chunks as floats: the values kv_load reads, bit for bit.
template <int kChunks>
__device__ __forceinline__ float4 kv_decode_chunk(KvCodes codes, const KvChunks<kChunks>& c, int j) {
  const uint2 b = c.bits[j];
  if (codes == KvCodes::Bf16)
    return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u), __uint_as_float(b.y << 16),
                       __uint_as_float(b.y & 0xffff0000u));
  const float d = __half2float(__ushort_as_half(c.scale[j]));
  float x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int code = codes == KvCodes::Int8 ? static_cast<int>(static_cast<signed char>(b.x >> (8 * k)))
                                            : static_cast<int>((b.x >> (4 * k)) & 15u) - 8;
    x[k] = d * static_cast<float>(code);
  }
  return make_float4(x[0], x[1], x[2], x[3]);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Stores the head_dim floats of `src` (shared memory, complete before the call) as row (token, head) of the
// keys or the values; a Q4 half rotates src in place first. Called by every thread of the block; blockDim.x a
// multiple of 32.
__device__ __forceinline__ void kv_store_row(const PagedKv& kv, bool value, int token, int head, float* src) {
  const KvHalf& half = value ? kv.values : kv.keys;
  const long base = kv_row(kv, token, head) * kv.head_dim;
  if (half.codes == KvCodes::Bf16) {
    auto* dst = static_cast<__nv_bfloat16*>(half.data);
    for (int i = threadIdx.x; i < kv.head_dim; i += blockDim.x) dst[base + i] = __float2bfloat16(src[i]);
    return;
  }
  if (kv_rotated(half.codes)) kv_rotate_row(src, kv.head_dim);
  // One warp per 32-element group: d = amax / top rounded to fp16, code = round(x / d) (ties to even) clamped
  // to [lo, hi]. Int8: top 127, codes -127..127. Q4: top 7.5, codes -8..7: the grid -8d..7d holds every x in
  // [-7.5d, 7.5d] within d / 2 (the ends round to -8 and clamp to 7), the finest step with that bound.
  const bool q4 = half.codes == KvCodes::Q4;
  const float top = q4 ? 7.5f : 127.0f, lo = q4 ? -8.0f : -127.0f, hi = q4 ? 7.0f : 127.0f;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int g = threadIdx.x >> 5; g < kv.head_dim / kKvGroup; g += warps) {  // g is the same on the whole warp
    const float x = src[g * kKvGroup + lane];
    const __half d_half = __float2half(warp_max(fabsf(x)) / top);
    const float d = __half2float(d_half);
    const float q = d > 0.0f ? fminf(fmaxf(rintf(x / d), lo), hi) : 0.0f;
    const long at = base + g * kKvGroup + lane;
    if (q4) {
      const unsigned code = static_cast<unsigned>(static_cast<int>(q) + 8);
      const unsigned odd = __shfl_down_sync(0xffffffffu, code, 1);
      if ((lane & 1) == 0)
        static_cast<unsigned char*>(half.data)[at >> 1] = static_cast<unsigned char>(code | odd << 4);
    } else {
      static_cast<signed char*>(half.data)[at] = static_cast<signed char>(q);
    }
    if (lane == 0) half.scale[at / kKvGroup] = d_half;
  }
}

// q [head_dim] (shared memory, as for kv_rotate_row) into the keys' basis, once per token and q head.
__device__ __forceinline__ void kv_query_basis(const PagedKv& kv, float* q) {
  if (kv_rotated(kv.keys.codes)) kv_rotate_row(q, kv.head_dim);
}

// An attention output [head_dim] (a softmax-weighted sum of value rows; shared memory, as for kv_rotate_row)
// from the values' basis back to the model's, before the gate.
__device__ __forceinline__ void kv_output_basis(const PagedKv& kv, float* out) {
  if (kv_rotated(kv.values.codes)) kv_rotate_row(out, kv.head_dim);
}

}  // namespace strata::kernels
