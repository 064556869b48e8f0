// What the decode and chunk attention kernels share, so a chunk leaves the cache exactly as the same tokens
// decoded one by one would: the per-head prep of one token (same code, same block size, same arithmetic); the
// order of a query's attended tokens; the merge of split partials; the argument checks. Internal to the
// attention kernels.
#pragma once

#include <math.h>

#include "attention.cuh"
#include "mixer_rows.cuh"
#include "q8_32_blocks.cuh"

namespace strata::kernels {

// Threads per prep block: block_sum's reduction order, and so every normed row, depends on it.
constexpr int kPrepThreads = 128;

// The rows of one token that attention prep reads and writes.
struct PrepTokenRows {
  const float* q_gate;  // [n_head][2 * head_dim]
  const float* k;       // [n_head_kv][head_dim]
  const float* v;       // [n_head_kv][head_dim]
  float* q_out;         // [n_head][head_dim]
};

// Block b of a token's prep at position p (row: head_dim floats of shared memory). Blocks [0, H) norm and rope
// a q head into q_out; [H, H + Hkv) a k head and [H + Hkv, H + 2 Hkv) a v head go into the cache at row p.
__device__ __forceinline__ void attention_prep_head(const AttentionShape& shape, int b, int p,
                                                    const PrepTokenRows& rows, const float* q_norm,
                                                    const float* k_norm, const float* rope_cos,
                                                    const float* rope_sin, const PagedKv& kv, float* row) {
  const int d = shape.head_dim, half = shape.rope_dim / 2;
  const float* cos = rope_cos + static_cast<long>(p) * half;
  const float* sin = rope_sin + static_cast<long>(p) * half;
  if (b < shape.n_head) {
    norm_rope_row(rows.q_gate + static_cast<long>(b) * 2 * d, q_norm, d, shape.eps, cos, sin, half, row);
    kv_query_basis(kv, row);
    for (int i = threadIdx.x; i < d; i += blockDim.x) rows.q_out[b * d + i] = row[i];
  } else if (b < shape.n_head + shape.n_head_kv) {
    const int j = b - shape.n_head;
    norm_rope_row(rows.k + j * d, k_norm, d, shape.eps, cos, sin, half, row);
    kv_store_row(kv, false, p, j, row);
  } else {
    const int j = b - shape.n_head - shape.n_head_kv;
    for (int i = threadIdx.x; i < d; i += blockDim.x) row[i] = rows.v[j * d + i];
    __syncthreads();
    kv_store_row(kv, true, p, j, row);
  }
}

// Token idx of a query's attended tokens, compacted: dense, token idx itself; with a QSA selection, its
// selected blocks' tokens in order (chosen_tokens = blocks x r), then its open tail from complete * r on
// (complete: the query's complete blocks). attention_decode's splits and attention_chunk's gathered mode cut
// this list into spans and tiles.
__device__ __forceinline__ int attended_token(int idx, bool sparse, const int* selected, int chosen_tokens,
                                              int complete, int r) {
  if (!sparse) return idx;
  return idx < chosen_tokens ? selected[idx / r] * r + idx % r : complete * r + (idx - chosen_tokens);
}

__device__ __forceinline__ float attention_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Online-softmax partials of spans of the attended tokens: per (head, span) the max and sum of the exponentials
// and the unnormalised accumulator [head_dim]; an idle span has max -inf.
struct AttentionPartials {
  const float* max;
  const float* sum;
  const float* acc;
};

// One head's output from the partials of its `splits` spans base .. base + splits - 1 (at most kDecodeSplits):
// combined and normalised into a [head_dim] (shared memory), rotated back into the model's basis where the values
// are stored rotated (kv_output_basis), and gated by gate [head_dim] into out [head_dim], with out's q8_32 form
// into out_q8 (the head's blocks; none by default). Every thread of the block calls it. One warp weighs the spans first (exp(max - top) each, and the weighted sum of their sums), so each
// output sums its spans' accumulators alone, their loads independent of one another.
__device__ __forceinline__ void attention_merge_head(const AttentionPartials& partials, long base, int splits,
                                                     int d, const PagedKv& kv, const float* gate, float* out,
                                                     float* a, const Q8Blocks& out_q8 = {}) {
  __shared__ float weight[kDecodeSplits];  // 0 for an idle span (max -inf), whose accumulator may be unwritten
  __shared__ float total;
  if (threadIdx.x < 32) {
    float top = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) top = fmaxf(top, partials.max[base + s]);
    top = warp_max(top);
    float den = 0.0f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float ms = partials.max[base + s];
      const float f = ms == -INFINITY ? 0.0f : __expf(ms - top);
      weight[s] = f;
      den += ms == -INFINITY ? 0.0f : partials.sum[base + s] * f;
    }
    den = warp_sum(den);
    if (threadIdx.x == 0) total = den;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float num = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (weight[s] != 0.0f) num += partials.acc[(base + s) * d + i] * weight[s];
    a[i] = total > 0.0f ? num / total : 0.0f;
  }
  __syncthreads();
  kv_output_basis(kv, a);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {  // d and blockDim.x are whole warps: a warp holds a block
    const float v = a[i] * attention_sigmoid(gate[i]);
    out[i] = v;
    store_q8_32(v, out_q8, i);
  }
}

inline bool valid_codes(KvCodes codes) {
  return codes == KvCodes::Bf16 || codes == KvCodes::Int8 || codes == KvCodes::Q4;
}

inline bool valid_kv_half(const KvHalf& half) {
  return half.data != nullptr && (half.codes == KvCodes::Bf16 || half.scale != nullptr) && valid_codes(half.codes);
}

// The shape and cache format every attention launcher requires, whatever the cache's pointers (the row launchers'
// are offsets into an arena, which may be null).
inline bool valid_attention_format(const AttentionShape& shape, const PagedKv& kv) {
  return shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0 &&
         shape.head_dim > 0 && shape.head_dim % 32 == 0 && shape.head_dim <= kMaxHeadDim &&
         shape.rope_dim >= 0 && shape.rope_dim % 2 == 0 && shape.rope_dim <= shape.head_dim &&
         kv.n_head_kv == shape.n_head_kv && kv.head_dim == shape.head_dim && kv.page_size > 0 &&
         kv.page_size % 4 == 0 && valid_codes(kv.keys.codes) && valid_codes(kv.values.codes);
}

// ... and a cache whose pointers are its own.
inline bool valid_attention(const AttentionShape& shape, const PagedKv& kv) {
  return valid_attention_format(shape, kv) && kv.page_table != nullptr && valid_kv_half(kv.keys) &&
         valid_kv_half(kv.values);
}

}  // namespace strata::kernels
