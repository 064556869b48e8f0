// Paged attention KV cache: layout, row append and element reads, for bf16 and int8 (per-32 fp16 scales).
// Device helpers only; the attention kernels (attention.cu) use them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace strata::kernels {

enum class KvFormat : int { BF16 = 0, INT8 = 1 };

constexpr int kKvGroup = 32;  // int8: one fp16 scale per 32 consecutive elements of a head row

// One attention layer's cache. Physical page p holds, for each kv head, page_size token rows of head_dim:
// element (token t, head j, dim i) lives in page page_table[t / page_size] at
// ((p * n_head_kv + j) * page_size + t % page_size) * head_dim + i. Pages hold whole QSA blocks.
struct PagedKv {
  KvFormat format = KvFormat::BF16;
  int n_head_kv = 0;
  int head_dim = 0;        // a multiple of 32
  int page_size = 0;       // tokens per page, a multiple of 4
  int max_pages = 0;       // entries of page_table
  void* k = nullptr;       // bf16 or int8 elements
  void* v = nullptr;
  __half* k_scale = nullptr;  // int8 only: [pages][n_head_kv][page_size][head_dim / 32]
  __half* v_scale = nullptr;
  const int* page_table = nullptr;  // device [max_pages]: logical page -> physical page
};

// Index of the row (token, head) counted in rows of head_dim elements.
__device__ __forceinline__ long kv_row(const PagedKv& kv, int token, int head) {
  const long page = kv.page_table[token / kv.page_size];
  return (page * kv.n_head_kv + head) * kv.page_size + token % kv.page_size;
}

__device__ __forceinline__ float kv_load(const PagedKv& kv, bool value, long row, int i) {
  const long at = row * kv.head_dim + i;
  if (kv.format == KvFormat::BF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(value ? kv.v : kv.k)[at]);
  const __half* scale = value ? kv.v_scale : kv.k_scale;
  const float d = __half2float(scale[row * (kv.head_dim / kKvGroup) + i / kKvGroup]);
  return d * static_cast<float>(static_cast<const signed char*>(value ? kv.v : kv.k)[at]);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Stores the head_dim floats of `src` (shared memory, complete before the call) as row (token, head).
// Called by every thread of the block; blockDim.x a multiple of 32.
__device__ __forceinline__ void kv_store_row(const PagedKv& kv, bool value, int token, int head, const float* src) {
  const long row = kv_row(kv, token, head);
  const long base = row * kv.head_dim;
  if (kv.format == KvFormat::BF16) {
    auto* dst = static_cast<__nv_bfloat16*>(value ? kv.v : kv.k);
    for (int i = threadIdx.x; i < kv.head_dim; i += blockDim.x) dst[base + i] = __float2bfloat16(src[i]);
    return;
  }
  // int8: one warp per 32-element group; d = amax / 127 rounded to fp16, code = round(x / d).
  auto* codes = static_cast<signed char*>(value ? kv.v : kv.k);
  __half* scale = value ? kv.v_scale : kv.k_scale;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int g = threadIdx.x >> 5; g < kv.head_dim / kKvGroup; g += warps) {
    const float x = src[g * kKvGroup + lane];
    const __half d_half = __float2half(warp_max(fabsf(x)) / 127.0f);
    const float d = __half2float(d_half);
    const float q = d > 0.0f ? fminf(fmaxf(rintf(x / d), -127.0f), 127.0f) : 0.0f;
    codes[base + g * kKvGroup + lane] = static_cast<signed char>(q);
    if (lane == 0) scale[row * (kv.head_dim / kKvGroup) + g] = d_half;
  }
}

}  // namespace strata::kernels
