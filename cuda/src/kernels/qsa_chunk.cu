#include <algorithm>

#include "launch.cuh"
#include "qsa_chunk.cuh"
#include "qsa_rows.cuh"

namespace strata::kernels {
namespace {

// Queries scored and selected at once, each with its own score row of scratch: about as many 1024-thread
// blocks as an H200 holds at a time (two per SM), so more would only grow the scratch.
constexpr int kSelectSlots = 256;

// Block i owns QSA block p / ratio + i (p the chunk's first position): it stores the chunk's raw keys in that
// block and pools the block if the chunk completes it. Pooling reads back, per thread, only the raw-key columns
// that thread stored (qsa_pool_block), and the rows before the chunk are already in the cache.
__global__ void qsa_append_chunk_kernel(IndexerShape shape, IndexerCache cache, const float* __restrict__ kraw,
                                        long kraw_stride, int tokens, const float* __restrict__ k_norm,
                                        const float* __restrict__ rope_cos, const float* __restrict__ rope_sin,
                                        const int* __restrict__ positions) {
  await_producers();
  release_consumers();
  extern __shared__ float shared[];
  const int r = shape.ratio, first = positions[0], last = first + tokens - 1;
  const int block = first / r + static_cast<int>(blockIdx.x);
  const int lo = max(first, block * r), hi = min(last, block * r + r - 1);
  if (lo > hi) return;  // past the chunk: uniform over the block
  for (int p = lo; p <= hi; ++p) qsa_store_raw_key(shape, cache, p, kraw + (p - first) * kraw_stride);
  if (block * r + r - 1 <= last) qsa_pool_block(shape, cache, block, k_norm, rope_cos, rope_sin, shared);
}

// Whether a query that sees n_blocks complete blocks keeps them all (qsa_select_top then needs no scores).
__device__ __forceinline__ bool keeps_all(const IndexerShape& shape, int n_blocks) {
  return n_blocks <= shape.keep_blocks;
}

// One block per query: its scoring query, as qsa_score_kernel prepares it, into the scratch rows.
__global__ void qsa_chunk_query_kernel(IndexerShape shape, IndexerSelectChunkArgs args) {
  await_producers();
  release_consumers();
  extern __shared__ float q[];
  const int t = blockIdx.x, p = args.positions[t];
  if (keeps_all(shape, (p + 1) / shape.ratio)) return;  // uniform over the block
  qsa_score_query(shape, args.q + t * args.q_stride, args.q_norm, args.rope_cos, args.rope_sin, p, q);
  const int width = shape.n_heads * shape.head_dim;
  for (int i = threadIdx.x; i < width; i += blockDim.x) args.scratch[static_cast<long>(t) * width + i] = q[i];
}

// Block s scores and selects queries s, s + gridDim.x, ... in turn in its own score row; one warp scores one
// block key as qsa_score_kernel does, so the scores, and with them the selections, are qsa_select's.
__global__ void qsa_chunk_select_kernel(IndexerShape shape, IndexerCache cache, IndexerSelectChunkArgs args,
                                        int tokens) {
  await_producers();
  release_consumers();
  extern __shared__ float q[];
  const int width = shape.n_heads * shape.head_dim;
  float* scores = args.scratch + static_cast<long>(tokens) * width + static_cast<long>(blockIdx.x) * shape.max_blocks;
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int n_blocks = (args.positions[t] + 1) / shape.ratio;
    if (!keeps_all(shape, n_blocks)) {  // uniform over the block
      for (int i = threadIdx.x; i < width; i += blockDim.x) q[i] = args.scratch[static_cast<long>(t) * width + i];
      __syncthreads();
      for (int b = warp; b < n_blocks; b += warps) {
        const float score = qsa_block_score(shape, q, cache.block_keys + static_cast<long>(b) * shape.head_dim);
        if ((threadIdx.x & 31) == 0) scores[b] = score;
      }
      __syncthreads();  // the whole score row written (and visible to the block) before the selection reads it
    }
    int* selected = args.selected_blocks + static_cast<long>(t) * shape.keep_blocks;
    qsa_select_top(n_blocks, shape.keep_blocks, scores, selected, args.n_selected + t);
    __syncthreads();  // q and the score row are rewritten for the next query
  }
}

}  // namespace

cudaError_t qsa_append_chunk(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                             long kraw_stride, int tokens, const float* k_norm, const float* rope_cos,
                             const float* rope_sin, const int* positions, cudaStream_t stream) {
  if (!valid_indexer_append(shape) || tokens <= 0 || kraw_stride < shape.head_dim || kraw == nullptr ||
      k_norm == nullptr || rope_cos == nullptr || rope_sin == nullptr || positions == nullptr ||
      cache.raw_keys == nullptr || cache.block_keys == nullptr)
    return cudaErrorInvalidValue;
  // The chunk's tokens touch at most (tokens - 1) / ratio + 2 QSA blocks, wherever it starts.
  const int grid = (tokens - 1) / shape.ratio + 2;
  const size_t smem = 2 * static_cast<size_t>(shape.head_dim) * sizeof(float);
  return launch(qsa_append_chunk_kernel, grid, kAppendThreads, smem, stream, shape, cache, kraw, kraw_stride, tokens,
                k_norm, rope_cos, rope_sin, positions);
}

std::size_t qsa_select_chunk_scratch_floats(const IndexerShape& shape, int tokens) {
  if (tokens <= 0 || shape.n_heads <= 0 || shape.head_dim <= 0 || shape.max_blocks <= 0) return 0;
  return static_cast<std::size_t>(tokens) * shape.n_heads * shape.head_dim +
         static_cast<std::size_t>(std::min(tokens, kSelectSlots)) * shape.max_blocks;
}

cudaError_t qsa_select_chunk(const IndexerShape& shape, const IndexerCache& cache,
                             const IndexerSelectChunkArgs& args, int tokens, cudaStream_t stream) {
  const long width = static_cast<long>(shape.n_heads) * shape.head_dim;
  if (!valid_indexer_select(shape) || tokens <= 0 || args.q_stride < width || args.q == nullptr ||
      args.q_norm == nullptr || args.rope_cos == nullptr || args.rope_sin == nullptr || args.positions == nullptr ||
      args.scratch == nullptr || args.selected_blocks == nullptr || args.n_selected == nullptr ||
      cache.block_keys == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.n_heads) * shape.head_dim * sizeof(float);
  const cudaError_t launched = launch(qsa_chunk_query_kernel, tokens, kScoreThreads, smem, stream, shape, args);
  if (launched != cudaSuccess) return launched;
  return launch(qsa_chunk_select_kernel, std::min(tokens, kSelectSlots), kSelectThreads, smem, stream, shape, cache,
                args, tokens);
}

}  // namespace strata::kernels
