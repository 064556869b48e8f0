#include <math.h>

#include "attention.cuh"
#include "mixer_rows.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kPrepThreads = 128;
constexpr int kDecodeWarps = 8;
constexpr int kMaxDimPerLane = 16;  // head_dim <= 512

// Blocks [0, H): q heads; [H, H + Hkv): k heads; [H + Hkv, H + 2 Hkv): v heads.
__global__ void attention_prep_kernel(AttentionShape shape, AttentionPrepArgs args, PagedKv kv) {
  extern __shared__ float row[];
  const int d = shape.head_dim, half = shape.rope_dim / 2;
  const int p = *args.position;
  const float* cos = args.rope_cos + static_cast<long>(p) * half;
  const float* sin = args.rope_sin + static_cast<long>(p) * half;
  const int b = blockIdx.x;
  if (b < shape.n_head) {
    norm_rope_row(args.q_gate + static_cast<long>(b) * 2 * d, args.q_norm, d, shape.eps, cos, sin, half, row);
    kv_query_basis(kv, row);
    for (int i = threadIdx.x; i < d; i += blockDim.x) args.q_out[b * d + i] = row[i];
  } else if (b < shape.n_head + shape.n_head_kv) {
    const int j = b - shape.n_head;
    norm_rope_row(args.k + j * d, args.k_norm, d, shape.eps, cos, sin, half, row);
    kv_store_row(kv, false, p, j, row);
  } else {
    const int j = b - shape.n_head - shape.n_head_kv;
    for (int i = threadIdx.x; i < d; i += blockDim.x) row[i] = args.v[j * d + i];
    __syncthreads();
    kv_store_row(kv, true, p, j, row);
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// One block per q-head; each warp runs an online softmax over a strided share of the attended tokens,
// then the warps' partial (max, sum, accumulator) merge in shared memory.
__global__ void attention_decode_kernel(AttentionShape shape, AttentionDecodeArgs args, PagedKv kv) {
  extern __shared__ float shared[];
  const int d = shape.head_dim, per_lane = d / 32;
  const int h = blockIdx.x, kvh = h / (shape.n_head / shape.n_head_kv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* q = shared;                          // [d]
  float* part_acc = q + d;                    // [warps][d]
  float* part_max = part_acc + kDecodeWarps * d;
  float* part_sum = part_max + kDecodeWarps;
  for (int i = threadIdx.x; i < d; i += blockDim.x) q[i] = args.q[h * d + i];
  __syncthreads();

  const int n = *args.position + 1;
  const int r = args.block_tokens;
  const bool sparse = args.selected_blocks != nullptr;
  const int complete = sparse ? n / r : 0;
  const int chosen_tokens = sparse ? *args.n_selected * r : 0;
  const int count = sparse ? chosen_tokens + (n - complete * r) : n;
  const float scale = rsqrtf(static_cast<float>(d));

  float m = -INFINITY, l = 0.0f, acc[kMaxDimPerLane];
#pragma unroll
  for (int e = 0; e < kMaxDimPerLane; ++e) acc[e] = 0.0f;
  for (int idx = warp; idx < count; idx += kDecodeWarps) {
    int t = idx;
    if (sparse) t = idx < chosen_tokens ? args.selected_blocks[idx / r] * r + idx % r : complete * r + (idx - chosen_tokens);
    const long row = kv_row(kv, t, kvh);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxDimPerLane; ++e)
      if (e < per_lane) dot += q[lane + 32 * e] * kv_load(kv, false, row, lane + 32 * e);
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float correction = __expf(m - m_new);  // 0 on the first token (m = -inf)
    const float weight = __expf(s - m_new);
    l = l * correction + weight;
#pragma unroll
    for (int e = 0; e < kMaxDimPerLane; ++e)
      if (e < per_lane) acc[e] = acc[e] * correction + weight * kv_load(kv, true, row, lane + 32 * e);
    m = m_new;
  }
#pragma unroll
  for (int e = 0; e < kMaxDimPerLane; ++e)
    if (e < per_lane) part_acc[warp * d + lane + 32 * e] = acc[e];
  if (lane == 0) {
    part_max[warp] = m;
    part_sum[warp] = l;
  }
  __syncthreads();

  float top = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) top = fmaxf(top, part_max[w]);
  float* a = q;  // every warp is past its loop: q is read no more
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      if (part_max[w] == -INFINITY) continue;  // a warp that saw no token
      const float f = __expf(part_max[w] - top);
      num += part_acc[w * d + i] * f;
      den += part_sum[w] * f;
    }
    a[i] = den > 0.0f ? num / den : 0.0f;
  }
  __syncthreads();
  kv_output_basis(kv, a);
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    args.out[h * d + i] = a[i] * sigmoid(args.q_gate[static_cast<long>(h) * 2 * d + d + i]);
}

bool valid_half(const KvHalf& half) {
  return half.data != nullptr && (half.codes == KvCodes::Bf16 || half.scale != nullptr) &&
         (half.codes == KvCodes::Bf16 || half.codes == KvCodes::Int8 || half.codes == KvCodes::Q4);
}

bool valid(const AttentionShape& shape, const PagedKv& kv) {
  return shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0 &&
         shape.head_dim > 0 && shape.head_dim % 32 == 0 && shape.head_dim <= 32 * kMaxDimPerLane &&
         shape.rope_dim >= 0 && shape.rope_dim % 2 == 0 && shape.rope_dim <= shape.head_dim &&
         kv.n_head_kv == shape.n_head_kv && kv.head_dim == shape.head_dim && kv.page_size > 0 &&
         kv.page_size % 4 == 0 && kv.page_table != nullptr && valid_half(kv.keys) && valid_half(kv.values);
}

}  // namespace

cudaError_t attention_prep(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                           cudaStream_t stream) {
  if (!valid(shape, kv)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim) * sizeof(float);
  attention_prep_kernel<<<shape.n_head + 2 * shape.n_head_kv, kPrepThreads, smem, stream>>>(shape, args, kv);
  return cudaGetLastError();
}

cudaError_t attention_decode(const AttentionShape& shape, const AttentionDecodeArgs& args, const PagedKv& kv,
                             cudaStream_t stream) {
  if (!valid(shape, kv) || args.block_tokens <= 0 || (args.selected_blocks == nullptr) != (args.n_selected == nullptr))
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim * (1 + kDecodeWarps) + 2 * kDecodeWarps) * sizeof(float);
  attention_decode_kernel<<<shape.n_head, 32 * kDecodeWarps, smem, stream>>>(shape, args, kv);
  return cudaGetLastError();
}

}  // namespace strata::kernels
