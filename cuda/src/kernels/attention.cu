#include <math.h>

#include "attention.cuh"
#include "attention_rows.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kDecodeThreads = 256;
constexpr int kDecodeTile = 16;       // tokens per K/V tile in shared memory (at most 32: a warp's lanes)
constexpr int kMaxOutPerThread = 32;  // q heads per kv head x head_dim <= kDecodeThreads * this
constexpr int kMergeThreads = 128;
constexpr size_t kMaxSplitSmem = 48 * 1024;  // the default dynamic shared memory limit: no opt-in needed

__global__ void attention_prep_kernel(AttentionShape shape, AttentionPrepArgs args, PagedKv kv) {
  extern __shared__ float row[];
  const PrepTokenRows rows{args.q_gate, args.k, args.v, args.q_out};
  attention_prep_head(shape, blockIdx.x, *args.position, rows, args.q_norm, args.k_norm, args.rope_cos,
                      args.rope_sin, kv, row);
}

// Flash decoding: the attended tokens are cut into kDecodeSplits spans; block (kv head, span) reads its span's
// K and V once, in tiles of kDecodeTile tokens, for all the q heads that share the kv head (GQA), and leaves
// an online-softmax partial (max, sum, unnormalised accumulator) per q head. attention_merge_kernel combines
// the spans. One block per q head reading every token serially left the GPU idle and latency-bound: decode
// slowed by ~0.7 ms per attention layer from 500 to 3,000 tokens of context.
__global__ void attention_split_kernel(AttentionShape shape, AttentionDecodeArgs args, PagedKv kv) {
  extern __shared__ float shared[];
  const int d = shape.head_dim, group = shape.n_head / shape.n_head_kv;
  const int kvh = blockIdx.x, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float* q = shared;                               // [group][d]
  float* tile = q + group * d;                     // [kDecodeTile][d]: K, then V of the same tokens
  float* p = tile + kDecodeTile * d;               // [group][kDecodeTile]: scores, then weights
  float* m = p + group * kDecodeTile;              // [group] running max
  float* l = m + group;                            // [group] running sum
  float* correction = l + group;                   // [group] this tile's rescale of the accumulators

  const int n = *args.position + 1;
  const int r = args.block_tokens;
  const bool sparse = args.selected_blocks != nullptr;
  const int complete = sparse ? n / r : 0;
  const int chosen_tokens = sparse ? *args.n_selected * r : 0;
  const int count = sparse ? chosen_tokens + (n - complete * r) : n;
  const int span = max((count + kDecodeSplits - 1) / kDecodeSplits, kDecodeTile);
  const int first = split * span, last = min(count, first + span);
  const long part = static_cast<long>(kvh * group) * kDecodeSplits + split;  // partial of q head kvh*group
  if (first >= last) {  // an idle span: the merge skips it
    for (int g = threadIdx.x; g < group; g += blockDim.x) args.partial_max[part + g * kDecodeSplits] = -INFINITY;
    return;
  }
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) q[i] = args.q[static_cast<long>(kvh * group) * d + i];
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  float acc[kMaxOutPerThread];
#pragma unroll
  for (int j = 0; j < kMaxOutPerThread; ++j) acc[j] = 0.0f;
  const float scale = rsqrtf(static_cast<float>(d));

  for (int t0 = first; t0 < last; t0 += kDecodeTile) {
    const int tokens = min(kDecodeTile, last - t0);
    __syncthreads();  // q, m, l ready; the previous tile's V and weights consumed
    for (int i = threadIdx.x; i < tokens * d; i += blockDim.x) {
      const int t = attended_token(t0 + i / d, sparse, args.selected_blocks, chosen_tokens, complete, r);
      tile[i] = kv_load(kv, false, kv_row(kv, t, kvh), i % d);
    }
    __syncthreads();
    for (int pair = warp; pair < group * kDecodeTile; pair += warps) {  // one warp per (q head, token)
      const int g = pair / kDecodeTile, t = pair % kDecodeTile;
      float dot = 0.0f;
      if (t < tokens)
        for (int i = lane; i < d; i += 32) dot += q[g * d + i] * tile[t * d + i];
      dot = warp_sum(dot);
      if (lane == 0) p[pair] = t < tokens ? dot * scale : -INFINITY;
    }
    __syncthreads();
    for (int g = warp; g < group; g += warps) {  // the online softmax step of each q head over this tile
      const float s = lane < kDecodeTile ? p[g * kDecodeTile + lane] : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(s));
      const float w = s == -INFINITY ? 0.0f : __expf(s - m_new);
      if (lane < kDecodeTile) p[g * kDecodeTile + lane] = w;
      const float sum = warp_sum(w);
      if (lane == 0) {
        correction[g] = __expf(m[g] - m_new);  // 0 on the first tile (m = -inf)
        l[g] = l[g] * correction[g] + sum;
        m[g] = m_new;
      }
    }
    for (int i = threadIdx.x; i < tokens * d; i += blockDim.x) {
      const int t = attended_token(t0 + i / d, sparse, args.selected_blocks, chosen_tokens, complete, r);
      tile[i] = kv_load(kv, true, kv_row(kv, t, kvh), i % d);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxOutPerThread; ++j) {
      const int o = threadIdx.x + j * blockDim.x;  // output (q head g, dim i) of this thread
      if (o >= group * d) break;
      const int g = o / d, i = o % d;
      float sum = 0.0f;
      for (int t = 0; t < tokens; ++t) sum += p[g * kDecodeTile + t] * tile[t * d + i];
      acc[j] = acc[j] * correction[g] + sum;
    }
  }
  __syncthreads();
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    args.partial_max[part + g * kDecodeSplits] = m[g];
    args.partial_sum[part + g * kDecodeSplits] = l[g];
  }
#pragma unroll
  for (int j = 0; j < kMaxOutPerThread; ++j) {
    const int o = threadIdx.x + j * blockDim.x;
    if (o >= group * d) break;
    args.partial_acc[(part + (o / d) * kDecodeSplits) * d + o % d] = acc[j];
  }
}

// One block per q head: the spans' partials combined, normalised, rotated back and gated (and quantized where
// asked: head_dim is whole blocks).
__global__ void attention_merge_kernel(AttentionShape shape, AttentionDecodeArgs args, PagedKv kv) {
  __shared__ float a[kMaxHeadDim];
  const int d = shape.head_dim, h = blockIdx.x;
  const AttentionPartials partials{args.partial_max, args.partial_sum, args.partial_acc};
  attention_merge_head(partials, static_cast<long>(h) * kDecodeSplits, kDecodeSplits, d, kv,
                       args.q_gate + static_cast<long>(h) * 2 * d + d, args.out + h * d, a,
                       q8_offset(args.out_q8, static_cast<long>(h) * d));
}

size_t split_smem_bytes(const AttentionShape& shape) {
  const int group = shape.n_head / shape.n_head_kv;
  return sizeof(float) * (static_cast<size_t>(group) * shape.head_dim + kDecodeTile * shape.head_dim +
                          group * kDecodeTile + 3 * group);
}

}  // namespace

cudaError_t attention_prep(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                           cudaStream_t stream) {
  if (!valid_attention(shape, kv)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim) * sizeof(float);
  attention_prep_kernel<<<shape.n_head + 2 * shape.n_head_kv, kPrepThreads, smem, stream>>>(shape, args, kv);
  return cudaGetLastError();
}

bool attention_decode_fits(const AttentionShape& shape) {
  return shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0 &&
         (shape.n_head / shape.n_head_kv) * shape.head_dim <= kDecodeThreads * kMaxOutPerThread &&
         split_smem_bytes(shape) <= kMaxSplitSmem;
}

size_t attention_decode_partial_floats(const AttentionShape& shape) {
  return static_cast<size_t>(shape.n_head) * kDecodeSplits * (shape.head_dim + 2);
}

cudaError_t attention_decode(const AttentionShape& shape, const AttentionDecodeArgs& args, const PagedKv& kv,
                             cudaStream_t stream) {
  if (!valid_attention(shape, kv) || !attention_decode_fits(shape) || args.block_tokens <= 0 ||
      (args.selected_blocks == nullptr) != (args.n_selected == nullptr) || args.partial_max == nullptr ||
      args.partial_sum == nullptr || args.partial_acc == nullptr)
    return cudaErrorInvalidValue;
  attention_split_kernel<<<dim3(shape.n_head_kv, kDecodeSplits), kDecodeThreads, split_smem_bytes(shape), stream>>>(
      shape, args, kv);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  attention_merge_kernel<<<shape.n_head, kMergeThreads, 0, stream>>>(shape, args, kv);
  return cudaGetLastError();
}

}  // namespace strata::kernels
