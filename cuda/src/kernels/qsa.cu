#include "launch.cuh"
#include "qsa.cuh"
#include "qsa_rows.cuh"

namespace strata::kernels {
namespace {

// Score blocks at most: eight per SM of an H200 (132), so that at 262,144 tokens (65,536 block keys) each warp
// scores about 8 keys. Each warp's keys are latency-bound (a 512-byte load, then four warp sums), so with two
// blocks per SM, as before, 31 keys in a row per warp made scoring cost ~50 us per layer and token there.
constexpr int kMaxScoreBlocks = 1056;

__global__ void qsa_append_kernel(IndexerShape shape, IndexerCache cache, const float* __restrict__ kraw,
                                  const float* __restrict__ k_norm, const float* __restrict__ rope_cos,
                                  const float* __restrict__ rope_sin, const int* __restrict__ position) {
  await_producers();
  release_consumers();
  extern __shared__ float shared[];
  const int p = *position;
  qsa_store_raw_key(shape, cache, p, kraw);
  if ((p + 1) % shape.ratio != 0) return;  // uniform over the block
  qsa_pool_block(shape, cache, p / shape.ratio, k_norm, rope_cos, rope_sin, shared);
}

// Every block prepares the normed, roped query in shared memory, then one warp scores one block key.
__global__ void qsa_score_kernel(IndexerShape shape, IndexerCache cache, IndexerSelectArgs args) {
  await_producers();
  release_consumers();
  extern __shared__ float q[];
  const int p = *args.position;
  const int n_blocks = (p + 1) / shape.ratio;
  const int warps_per_block = blockDim.x >> 5;
  // The grid is sized for the cache's capacity; early in a context most blocks have no key to score and would
  // only prepare the query (four RMSNorms, eight barriers).
  if (blockIdx.x * warps_per_block >= n_blocks) return;
  qsa_score_query(shape, args.q, args.q_norm, args.rope_cos, args.rope_sin, p, q);
  for (int b = blockIdx.x * warps_per_block + (threadIdx.x >> 5); b < n_blocks; b += gridDim.x * warps_per_block) {
    const float score = qsa_block_score(shape, q, cache.block_keys + static_cast<long>(b) * shape.head_dim);
    if ((threadIdx.x & 31) == 0) args.scores[b] = score;
  }
}

__global__ void qsa_top_blocks_kernel(IndexerShape shape, IndexerSelectArgs args) {
  await_producers();
  release_consumers();
  qsa_select_top((*args.position + 1) / shape.ratio, shape.keep_blocks, args.scores, args.selected_blocks,
                 args.n_selected);
}

// `cache`, its pointers offsets into an arena, in the arena of row r's span.
__device__ __forceinline__ IndexerCache cache_of(const IndexerCache& cache, const IndexerRows& rows, int r) {
  const StateSpan span = row_span(rows.spans, r, rows.rows);
  return {in_arena(cache.raw_keys, span.state), in_arena(cache.block_keys, span.state)};
}

// Block r: row r's raw key.
__global__ void qsa_store_rows_kernel(IndexerShape shape, IndexerCache cache, const float* __restrict__ kraw,
                                      IndexerRows rows) {
  await_producers();
  release_consumers();
  const int r = blockIdx.x;
  qsa_store_raw_key(shape, cache_of(cache, rows, r), rows.positions[r], kraw + static_cast<long>(r) * shape.head_dim);
}

// Block r: the block row r completes, if it does, pooled from the raw keys every row has stored.
__global__ void qsa_pool_rows_kernel(IndexerShape shape, IndexerCache cache, const float* __restrict__ k_norm,
                                     const float* __restrict__ rope_cos, const float* __restrict__ rope_sin,
                                     IndexerRows rows) {
  await_producers();
  release_consumers();
  extern __shared__ float shared[];
  const int r = blockIdx.x, p = rows.positions[r];
  if ((p + 1) % shape.ratio != 0) return;  // uniform over the block
  qsa_pool_block(shape, cache_of(cache, rows, r), p / shape.ratio, k_norm, rope_cos, rope_sin, shared);
}

// Row r's arguments (qsa_select_rows).
__device__ __forceinline__ IndexerSelectArgs row_args(const IndexerShape& shape, IndexerSelectArgs args, int q_stride,
                                                      const IndexerRows& rows, int r) {
  args.q += static_cast<long>(r) * q_stride;
  args.position = rows.positions + r;
  args.scores += static_cast<long>(r) * shape.max_blocks;
  args.selected_blocks += static_cast<long>(r) * shape.keep_blocks;
  args.n_selected += r;
  return args;
}

// Blocks (x, r): qsa_score_kernel's block x for row r.
__global__ void qsa_score_rows_kernel(IndexerShape shape, IndexerCache cache, IndexerSelectArgs args, int q_stride,
                                      IndexerRows rows) {
  await_producers();
  release_consumers();
  extern __shared__ float q[];
  const int r = blockIdx.y;
  const IndexerSelectArgs own = row_args(shape, args, q_stride, rows, r);
  const IndexerCache placed = cache_of(cache, rows, r);
  const int p = *own.position;
  const int n_blocks = (p + 1) / shape.ratio;
  const int warps_per_block = blockDim.x >> 5;
  if (blockIdx.x * warps_per_block >= n_blocks) return;  // as in qsa_score_kernel
  qsa_score_query(shape, own.q, own.q_norm, own.rope_cos, own.rope_sin, p, q);
  for (int b = blockIdx.x * warps_per_block + (threadIdx.x >> 5); b < n_blocks; b += gridDim.x * warps_per_block) {
    const float score = qsa_block_score(shape, q, placed.block_keys + static_cast<long>(b) * shape.head_dim);
    if ((threadIdx.x & 31) == 0) own.scores[b] = score;
  }
}

// Block r: row r's selection.
__global__ void qsa_top_rows_kernel(IndexerShape shape, IndexerSelectArgs args, int q_stride, IndexerRows rows) {
  await_producers();
  release_consumers();
  const IndexerSelectArgs own = row_args(shape, args, q_stride, rows, blockIdx.x);
  qsa_select_top((*own.position + 1) / shape.ratio, shape.keep_blocks, own.scores, own.selected_blocks,
                 own.n_selected);
}

bool valid_rows(const IndexerRows& rows) {
  return rows.rows > 0 && rows.positions != nullptr && valid_spans(rows.spans);
}

}  // namespace

cudaError_t qsa_append(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                       const float* k_norm, const float* rope_cos, const float* rope_sin, const int* position,
                       cudaStream_t stream) {
  if (!valid_indexer_append(shape)) return cudaErrorInvalidValue;
  const size_t smem = 2 * static_cast<size_t>(shape.head_dim) * sizeof(float);
  return launch(qsa_append_kernel, 1, kAppendThreads, smem, stream, shape, cache, kraw, k_norm, rope_cos, rope_sin,
                position);
}

cudaError_t qsa_select(const IndexerShape& shape, const IndexerCache& cache, const IndexerSelectArgs& args,
                       cudaStream_t stream) {
  if (!valid_indexer_select(shape)) return cudaErrorInvalidValue;
  const int warps = kScoreThreads / 32;
  const int grid = min((shape.max_blocks + warps - 1) / warps, kMaxScoreBlocks);
  const size_t smem = static_cast<size_t>(shape.n_heads) * shape.head_dim * sizeof(float);
  const cudaError_t launched = launch(qsa_score_kernel, grid, kScoreThreads, smem, stream, shape, cache, args);
  return launched != cudaSuccess ? launched : qsa_top_blocks(shape, args, stream);
}

cudaError_t qsa_top_blocks(const IndexerShape& shape, const IndexerSelectArgs& args, cudaStream_t stream) {
  if (shape.ratio <= 0 || shape.keep_blocks <= 0) return cudaErrorInvalidValue;
  return launch(qsa_top_blocks_kernel, 1, kSelectThreads, 0, stream, shape, args);
}

cudaError_t qsa_append_rows(const IndexerShape& shape, const IndexerCache& cache, const float* kraw,
                            const float* k_norm, const float* rope_cos, const float* rope_sin,
                            const IndexerRows& rows, cudaStream_t stream) {
  if (!valid_indexer_append(shape) || !valid_rows(rows)) return cudaErrorInvalidValue;
  const cudaError_t stored =
      launch(qsa_store_rows_kernel, rows.rows, kAppendThreads, 0, stream, shape, cache, kraw, rows);
  if (stored != cudaSuccess) return stored;
  const size_t smem = 2 * static_cast<size_t>(shape.head_dim) * sizeof(float);
  return launch(qsa_pool_rows_kernel, rows.rows, kAppendThreads, smem, stream, shape, cache, k_norm, rope_cos,
                rope_sin, rows);
}

cudaError_t qsa_select_rows(const IndexerShape& shape, const IndexerCache& cache, const IndexerSelectArgs& args,
                            int q_stride, const IndexerRows& rows, cudaStream_t stream) {
  if (!valid_indexer_select(shape) || !valid_rows(rows) || q_stride < shape.n_heads * shape.head_dim)
    return cudaErrorInvalidValue;
  const int warps = kScoreThreads / 32;
  const int grid = min((shape.max_blocks + warps - 1) / warps, kMaxScoreBlocks);
  const size_t smem = static_cast<size_t>(shape.n_heads) * shape.head_dim * sizeof(float);
  const cudaError_t scored =
      launch(qsa_score_rows_kernel, dim3(grid, rows.rows), kScoreThreads, smem, stream, shape, cache, args, q_stride,
             rows);
  if (scored != cudaSuccess) return scored;
  return launch(qsa_top_rows_kernel, rows.rows, kSelectThreads, 0, stream, shape, args, q_stride, rows);
}

}  // namespace strata::kernels
