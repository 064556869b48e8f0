// The float GEMV's row dot (gemv_float.cu), shared with the kernels that fuse a GEMV into their own launch
// (router_publish.cu, hc_read.cu): one definition, so a fused product is the same bits as gemv_float's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "strata/forms.hpp"

namespace strata::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Each lane reads `Vec` weights (16 bytes when Vec > 1) at a time, kFloatUnroll chunks issued before any is
// used so that enough bytes are in flight to cover HBM latency; Vec == 1 handles unaligned shapes.
constexpr int kFloatUnroll = 4;

template <class T, int Vec>
struct alignas(Vec > 1 ? 16 : sizeof(T)) Chunk {
  T v[Vec];
};

// The activation x as a row dot reads it: from global memory through the read-only path (the GEMVs), or
// staged in shared memory by the kernel that reads it (hc_read.cu). 16-byte aligned where Vec > 1.
struct GlobalF32 {
  const float* __restrict__ x;
  __device__ __forceinline__ float4 four(int i) const { return __ldg(reinterpret_cast<const float4*>(x + i)); }
  __device__ __forceinline__ float one(int i) const { return __ldg(x + i); }
};
struct SharedF32 {
  const float* x;
  __device__ __forceinline__ float4 four(int i) const { return *reinterpret_cast<const float4*>(x + i); }
  __device__ __forceinline__ float one(int i) const { return x[i]; }
};

// Chunk c of the row, columns i .. i + Vec - 1, dotted with x's into acc.
template <class T, int Vec, class X>
__device__ __forceinline__ float chunk_dot(const Chunk<T, Vec>& c, const X& x, int i, float acc) {
  if constexpr (Vec > 1) {
#pragma unroll
    for (int j = 0; j < Vec; j += 4) {
      const float4 xv = x.four(i + j);
      acc = fmaf(to_float(c.v[j]), xv.x, acc);
      acc = fmaf(to_float(c.v[j + 1]), xv.y, acc);
      acc = fmaf(to_float(c.v[j + 2]), xv.z, acc);
      acc = fmaf(to_float(c.v[j + 3]), xv.w, acc);
    }
  } else {
    acc = fmaf(to_float(c.v[0]), x.one(i), acc);
  }
  return acc;
}

// Calls dot(chunk, i) for this lane's chunks of row `wr` [cols] in order: chunks slot, slot + slots, ... of Vec
// columns, i the chunk's first column. A GEMV warp `part` of `split` per row is slots part * 32 + lane of 32 * split.
template <class T, int Vec, class Dot>
__device__ __forceinline__ void for_row_chunks(const T* __restrict__ wr, int cols, int slot, int slots, Dot&& dot) {
  const int stride = slots * Vec;
  for (int base = slot * Vec; base < cols; base += stride * kFloatUnroll) {
    Chunk<T, Vec> c[kFloatUnroll];
#pragma unroll
    for (int u = 0; u < kFloatUnroll; ++u) {
      const int i = base + u * stride;
      if (i < cols) c[u] = *reinterpret_cast<const Chunk<T, Vec>*>(wr + i);
    }
#pragma unroll
    for (int u = 0; u < kFloatUnroll; ++u) {
      const int i = base + u * stride;
      if (i < cols) dot(c[u], i);
    }
  }
}

// This lane's share of the dot of row `wr` [cols] with x (GlobalF32, SharedF32), before the caller's reduction
// over the slots (for_row_chunks).
template <class T, int Vec, class X>
__device__ __forceinline__ float float_row_partial(const T* __restrict__ wr, int cols, const X& x, int slot,
                                                   int slots) {
  float acc = 0.0f;
  for_row_chunks<T, Vec>(wr, cols, slot, slots,
                         [&](const Chunk<T, Vec>& c, int i) { acc = chunk_dot<T, Vec>(c, x, i, acc); });
  return acc;
}

// float_row_partial for `inputs` (1..N) activations at once, input j's x at x + j * x_stride: each chunk of the
// row is loaded once and dotted with every input's x in turn, so acc[j] is, bit for bit, float_row_partial's of
// input j (the same chunks in the same order, each input's fma chain its own).
template <class T, int Vec, int N>
__device__ __forceinline__ void float_row_partials(const T* __restrict__ wr, int cols, const float* __restrict__ x,
                                                   long x_stride, int inputs, int slot, int slots, float (&acc)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.0f;
  for_row_chunks<T, Vec>(wr, cols, slot, slots, [&](const Chunk<T, Vec>& c, int i) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (j < inputs) acc[j] = chunk_dot<T, Vec>(c, GlobalF32{x + j * x_stride}, i, acc[j]);
    }
  });
}

// The element type and vector width of one float GEMV kernel.
template <class T, int Vec>
struct FloatRows {
  using Element = T;
  static constexpr int kVec = Vec;
};

// Calls visit(FloatRows<T, Vec>{}) for the element type of `kind` and the widest path its operands allow: the
// 16-byte one needs every row of every matrix and every x_j aligned (cols * sizeof(T) and x_stride * 4
// multiples of 16 keep the bases' alignment). False for an unknown kind.
template <class Visit>
bool visit_float_rows(FloatKind kind, const void* w, int cols, int x_stride, const float* x, Visit&& visit) {
  auto pick = [&](auto element) {
    using T = decltype(element);
    constexpr int kVec = 16 / sizeof(T);
    if (cols % kVec == 0 && x_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 &&
        reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
      visit(FloatRows<T, kVec>{});
    } else {
      visit(FloatRows<T, 1>{});
    }
    return true;
  };
  switch (kind) {
    case FloatKind::F32: return pick(float{});
    case FloatKind::F16: return pick(__half{});
    case FloatKind::BF16: return pick(__nv_bfloat16{});
  }
  return false;
}

}  // namespace strata::kernels
