#include <cub/block/block_scan.cuh>

#include "mixer_rows.cuh"
#include "qsa.cuh"

namespace strata::kernels {
namespace {

constexpr int kAppendThreads = 128;
constexpr int kScoreThreads = 256;
constexpr int kMaxScoreBlocks = 264;
constexpr int kSelectThreads = 1024;

__global__ void qsa_append_kernel(IndexerShape shape, IndexerCache cache, const float* __restrict__ kraw,
                                  const float* __restrict__ k_norm, const float* __restrict__ rope_cos,
                                  const float* __restrict__ rope_sin, const int* __restrict__ position) {
  extern __shared__ float shared[];
  float* pooled = shared;
  float* keyed = shared + shape.head_dim;
  const int d = shape.head_dim, r = shape.ratio, p = *position;
  for (int i = threadIdx.x; i < d; i += blockDim.x) cache.raw_keys[static_cast<long>(p) * d + i] = kraw[i];
  if ((p + 1) % r != 0) return;  // uniform over the block
  const int block = p / r;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;  // each thread reads back only the column it wrote, so no barrier is needed
    for (int j = 0; j < r; ++j) sum += cache.raw_keys[(static_cast<long>(block) * r + j) * d + i];
    pooled[i] = sum / static_cast<float>(r);
  }
  __syncthreads();
  const int half = shape.rope_dim / 2;
  const long start = static_cast<long>(block) * r;  // RoPE at the block's first position
  norm_rope_row(pooled, k_norm, d, shape.eps, rope_cos + start * half, rope_sin + start * half, half, keyed);
  for (int i = threadIdx.x; i < d; i += blockDim.x) cache.block_keys[static_cast<long>(block) * d + i] = keyed[i];
}

// Every block prepares the normed, roped query in shared memory, then one warp scores one block key.
__global__ void qsa_score_kernel(IndexerShape shape, IndexerCache cache, IndexerSelectArgs args) {
  extern __shared__ float q[];
  const int d = shape.head_dim, half = shape.rope_dim / 2, p = *args.position;
  for (int h = 0; h < shape.n_heads; ++h)
    norm_rope_row(args.q + h * d, args.q_norm, d, shape.eps, args.rope_cos + static_cast<long>(p) * half,
                  args.rope_sin + static_cast<long>(p) * half, half, q + h * d);
  const int n_blocks = (p + 1) / shape.ratio;
  const int lane = threadIdx.x & 31;
  const int warps_per_block = blockDim.x >> 5;
  const float scale = rsqrtf(static_cast<float>(d));
  for (int b = blockIdx.x * warps_per_block + (threadIdx.x >> 5); b < n_blocks; b += gridDim.x * warps_per_block) {
    const float* key = cache.block_keys + static_cast<long>(b) * d;
    float total = 0.0f;
    for (int h = 0; h < shape.n_heads; ++h) {
      float dot = 0.0f;
      for (int i = lane; i < d; i += 32) dot += q[h * d + i] * key[i];
      total += fmaxf(warp_sum(dot), 0.0f);
    }
    if (lane == 0) args.scores[b] = total * scale;
  }
}

// Order-preserving map of a float to uint32 (larger float, larger key); -0 and +0 map together.
__device__ __forceinline__ unsigned order_key(float x) {
  const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One block: radix-select the keep-th largest score (8 bits per pass), then write, in ascending block order,
// every block above it and the lowest-indexed blocks equal to it.
__global__ void qsa_top_blocks_kernel(IndexerShape shape, IndexerSelectArgs args) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int histogram[256];
  __shared__ unsigned chosen_prefix;
  __shared__ int still_needed;
  const int n_blocks = (*args.position + 1) / shape.ratio;
  const int keep = min(shape.keep_blocks, n_blocks);
  if (threadIdx.x == 0) *args.n_selected = keep;
  if (keep == n_blocks) {
    for (int b = threadIdx.x; b < n_blocks; b += blockDim.x) args.selected_blocks[b] = b;
    return;
  }
  unsigned prefix = 0, mask = 0;
  int needed = keep;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    for (int b = threadIdx.x; b < n_blocks; b += blockDim.x) {
      const unsigned key = order_key(args.scores[b]);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, bin = 255;
      while (above + histogram[bin] < needed) above += histogram[bin--];
      chosen_prefix = prefix | (static_cast<unsigned>(bin) << shift);
      still_needed = needed - above;
    }
    __syncthreads();
    prefix = chosen_prefix;
    needed = still_needed;
    mask |= 255u << shift;
    __syncthreads();  // chosen_prefix / still_needed are rewritten next pass
  }
  // prefix is the threshold key; `needed` blocks equal to it are taken, lowest index first.
  int equal_before = 0, written = 0;
  for (int base = 0; base < n_blocks; base += blockDim.x) {
    const int b = base + threadIdx.x;
    const unsigned key = b < n_blocks ? order_key(args.scores[b]) : 0u;
    const int equal = b < n_blocks && key == prefix;
    int equal_rank, equal_total;
    Scan(scan_storage).ExclusiveSum(equal, equal_rank, equal_total);
    __syncthreads();
    const int take = b < n_blocks && (key > prefix || (equal && equal_before + equal_rank < needed));
    int slot, taken;
    Scan(scan_storage).ExclusiveSum(take, slot, taken);
    __syncthreads();
    if (take) args.selected_blocks[written + slot] = b;
    equal_before += equal_total;
    written += taken;
  }
}

}  // namespace

cudaError_t qsa_append(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                       const float* k_norm, const float* rope_cos, const float* rope_sin, const int* position,
                       cudaStream_t stream) {
  if (shape.head_dim <= 0 || shape.ratio <= 0 || shape.rope_dim % 2 != 0 || shape.rope_dim > shape.head_dim)
    return cudaErrorInvalidValue;
  const size_t smem = 2 * static_cast<size_t>(shape.head_dim) * sizeof(float);
  qsa_append_kernel<<<1, kAppendThreads, smem, stream>>>(shape, cache, kraw, k_norm, rope_cos, rope_sin, position);
  return cudaGetLastError();
}

cudaError_t qsa_select(const IndexerShape& shape, const IndexerCache& cache, const IndexerSelectArgs& args,
                       cudaStream_t stream) {
  if (shape.n_heads <= 0 || shape.head_dim <= 0 || shape.ratio <= 0 || shape.keep_blocks <= 0 ||
      shape.max_blocks <= 0 || shape.rope_dim % 2 != 0 || shape.rope_dim > shape.head_dim)
    return cudaErrorInvalidValue;
  const int warps = kScoreThreads / 32;
  const int grid = min((shape.max_blocks + warps - 1) / warps, kMaxScoreBlocks);
  const size_t smem = static_cast<size_t>(shape.n_heads) * shape.head_dim * sizeof(float);
  qsa_score_kernel<<<grid, kScoreThreads, smem, stream>>>(shape, cache, args);
  const cudaError_t launched = cudaGetLastError();
  return launched != cudaSuccess ? launched : qsa_top_blocks(shape, args, stream);
}

cudaError_t qsa_top_blocks(const IndexerShape& shape, const IndexerSelectArgs& args, cudaStream_t stream) {
  if (shape.ratio <= 0 || shape.keep_blocks <= 0) return cudaErrorInvalidValue;
  qsa_top_blocks_kernel<<<1, kSelectThreads, 0, stream>>>(shape, args);
  return cudaGetLastError();
}

}  // namespace strata::kernels
