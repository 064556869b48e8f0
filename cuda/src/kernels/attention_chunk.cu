#include <math.h>

#include <algorithm>
#include <climits>

#include "attention_chunk.cuh"
#include "attention_rows.cuh"
#include "launch.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kKeyTile = 32;          // tokens per K/V tile: one per lane, so a query's tile mask is one word
constexpr int kAccumulators = 64;     // at most, per thread: rows per warp x dims per lane (registers)
constexpr int kMaxTileQueries = 32;   // queries per block: one thread of warp 0 each walks its selection
constexpr int kNoToken = INT_MAX;
constexpr int kMergeThreads = 128;
// A chunk whose query tiles make fewer blocks than about two per SM of an H200 (132 SMs) cuts each query's
// tokens into spans, up to attention_decode's count: a few queries deep in a long context would otherwise scan
// it with a few blocks while the rest of the GPU idles.
constexpr int kTargetBlocks = 264;
constexpr int kMaxSplits = kDecodeSplits;

// Block (b, t) is block b of token t's prep (attention_prep_head): the same code and block size as
// attention_prep, so the same cells and q rows.
__global__ void attention_prep_chunk_kernel(AttentionShape shape, AttentionChunkPrepArgs args, PagedKv kv) {
  await_producers();
  release_consumers();
  extern __shared__ float row[];
  const int t = blockIdx.y;
  const PrepTokenRows rows{args.q_gate + t * args.q_gate_stride, args.k + t * args.k_stride,
                           args.v + t * args.v_stride,
                           args.q_out + static_cast<long>(t) * shape.n_head * shape.head_dim};
  attention_prep_head(shape, blockIdx.x, args.positions[t], rows, args.q_norm, args.k_norm, args.rope_cos,
                      args.rope_sin, kv, row);
}

// What a walker leaves in shared memory for each K/V tile, and what the scan keeps between tiles.
struct TileSlots {
  long rows[kKeyTile];             // cache row (kv_row) of the tile's token k; read only where a query attends it
  unsigned mask[kMaxTileQueries];  // per query of the block: which of the tile's tokens it attends (bit k)
  int next[kMaxTileQueries];       // the scan: each query's next attended token
};

// The tokens one query attends, in ascending order: its selected blocks (read through a cursor as the scan
// moves right), then its open tail tail..last. Dense causal: no blocks and tail 0.
struct QueryTokens {
  const int* blocks = nullptr;
  int count = 0;   // selected blocks
  int cursor = 0;  // the first block that does not end before the scan's position
  int tail = 0;    // first token of the open tail
  int last = -1;   // the query's position; -1 for a query past the chunk (attends nothing)
};

// The first of a query's blocks that ends at or after token `from` (its cursor for a scan starting there).
__device__ __forceinline__ int first_block_from(const QueryTokens& q, int ratio, int from) {
  int lo = 0, hi = q.count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (q.blocks[mid] * ratio + ratio - 1 < from) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The smallest attended token >= from (kNoToken if none); the cursor's block ends at or after `from`.
__device__ __forceinline__ int next_token(const QueryTokens& q, int ratio, int from) {
  int next = kNoToken;
  if (q.cursor < q.count) next = max(q.blocks[q.cursor] * ratio, from);
  const int tail = max(q.tail, from);
  if (tail <= q.last) next = min(next, tail);
  return next;
}

// Bits lo..hi (0 <= lo <= hi < 32).
__device__ __forceinline__ unsigned span_bits(int lo, int hi) {
  return (hi - lo == 31 ? ~0u : (1u << (hi - lo + 1)) - 1u) << lo;
}

// Which of tokens t0 .. t0 + kKeyTile - 1 the query attends (bit k: token t0 + k); moves the cursor past the
// blocks that end inside the tile. The scan never skips an attended token: t0 is the smallest next token.
__device__ __forceinline__ unsigned tile_mask(QueryTokens& q, int ratio, int t0) {
  const int end = t0 + kKeyTile - 1;
  unsigned bits = 0;
  while (q.cursor < q.count) {
    const int first = q.blocks[q.cursor] * ratio, last = first + ratio - 1;
    if (first > end) break;
    bits |= span_bits(max(first, t0) - t0, min(last, end) - t0);
    if (last > end) break;  // the block runs on into the next tile
    ++q.cursor;
  }
  const int lo = max(q.tail, t0), hi = min(q.last, end);
  if (lo <= hi) bits |= span_bits(lo - t0, hi - t0);
  return bits;
}

// Block span blockIdx.z of `count` items (positions, or a query's compacted tokens) cut into gridDim.z spans
// whole tiles wide: items from .. until - 1 (none where until <= from).
struct BlockSpan {
  int from;
  int until;
};

__device__ __forceinline__ BlockSpan block_span(int count) {
  const int spans = gridDim.z;
  const int width = (count + spans * kKeyTile - 1) / (spans * kKeyTile) * kKeyTile;
  const int from = blockIdx.z * width;
  return {from, min(count, from + width)};
}

// The scan: the union of the tokens a tile of consecutive queries attends in the block's span of positions,
// left to right, kKeyTile tokens at a time, jumping over tokens none attends, so several queries share each
// K/V tile load; per-query masks keep each query to its own tokens. Thread i < queries walks the selection of
// query first_query + i. Past qwen4exp's dense range the queries' selections differ and the union's tiles hold
// few attended tokens each: there the gathered mode (GatheredTiles) reads fewer tiles.
class ScanTiles {
 public:
  __device__ ScanTiles(const AttentionChunkArgs& args, int tokens, int first_query, int queries, TileSlots& slots)
      : queries_(queries), ratio_(args.block_tokens) {
    // The tokens the block's queries see: 0 .. the last query's position.
    const BlockSpan span = block_span(args.positions[min(first_query + queries, tokens) - 1] + 1);
    until_ = span.until;
    if (threadIdx.x >= queries) return;
    const int t = first_query + threadIdx.x;
    if (t < tokens) {
      mine_.last = args.positions[t];
      if (args.selected_blocks != nullptr) {
        mine_.blocks = args.selected_blocks + static_cast<long>(t) * args.selection_stride;
        mine_.count = args.n_selected[t];
        mine_.tail = (mine_.last + 1) / ratio_ * ratio_;
        mine_.cursor = first_block_from(mine_, ratio_, span.from);
      }
    }
    slots.next[threadIdx.x] = next_token(mine_, ratio_, span.from);
  }

  // The next tile into `slots` (visible to the block on return); false, on every thread, past the span.
  __device__ bool next(const PagedKv& kv, int kvh, TileSlots& slots) {
    int t0 = kNoToken;
    for (int i = 0; i < queries_; ++i) t0 = min(t0, slots.next[i]);
    if (t0 >= until_) return false;  // uniform: every thread reads the same slots.next (kNoToken: none left)
    __syncthreads();  // slots.next read by all; the previous tile consumed
    if (threadIdx.x < queries_) {
      const unsigned in_span = until_ - t0 >= kKeyTile ? ~0u : (1u << (until_ - t0)) - 1u;
      slots.mask[threadIdx.x] = tile_mask(mine_, ratio_, t0) & in_span;
      slots.next[threadIdx.x] = next_token(mine_, ratio_, t0 + kKeyTile);
    }
    const int token = t0 + static_cast<int>(threadIdx.x);
    if (threadIdx.x < kKeyTile && token < until_) slots.rows[threadIdx.x] = kv_row(kv, token, kvh);
    __syncthreads();
    return true;
  }

 private:
  QueryTokens mine_;  // thread i < queries_: query first_query + i
  int queries_;
  int ratio_;
  int until_ = 0;
};

// The gathered mode: one query's attended tokens compacted in attended_token's order (its selected blocks'
// tokens, then its open tail), the block's span of them kKeyTile at a time, so every tile but the span's last
// is full. Every thread holds the same walk.
class GatheredTiles {
 public:
  __device__ GatheredTiles(const AttentionChunkArgs& args, int /*tokens*/, int query, int /*queries*/,
                           TileSlots& /*slots*/)
      : sparse_(args.selected_blocks != nullptr), ratio_(args.block_tokens) {
    const int seen = args.positions[query] + 1;
    if (sparse_) {
      blocks_ = args.selected_blocks + static_cast<long>(query) * args.selection_stride;
      complete_ = seen / ratio_;
      chosen_tokens_ = args.n_selected[query] * ratio_;
    }
    const BlockSpan span = block_span(sparse_ ? chosen_tokens_ + seen - complete_ * ratio_ : seen);
    next_ = span.from;
    until_ = span.until;
  }

  // The next tile into `slots` (visible to the block on return); false, on every thread, past the span.
  __device__ bool next(const PagedKv& kv, int kvh, TileSlots& slots) {
    if (next_ >= until_) return false;  // uniform: every thread walks the same list
    __syncthreads();  // the previous tile consumed
    const int k = threadIdx.x, filled = min(kKeyTile, until_ - next_);
    if (k < filled)
      slots.rows[k] = kv_row(kv, attended_token(next_ + k, sparse_, blocks_, chosen_tokens_, complete_, ratio_), kvh);
    if (k == 0) slots.mask[0] = span_bits(0, filled - 1);
    next_ += kKeyTile;
    __syncthreads();
    return true;
  }

 private:
  const int* blocks_ = nullptr;
  bool sparse_;
  int ratio_;
  int complete_ = 0;       // the query's complete blocks
  int chosen_tokens_ = 0;  // its selected blocks' tokens
  int next_;               // the next tile's first index into the compacted list
  int until_;
};

// K or V rows of the tile's tokens (cache rows `rows`) into tile [kKeyTile][stride] as floats in the cache's
// basis, one warp per token. Tokens no query of the block attends (bit clear in `wanted`) are not loaded and
// read as zeros: their weights are 0, and 0 x a stale NaN would not be.
__device__ __forceinline__ void load_tile(const PagedKv& kv, bool value, const long* rows, unsigned wanted,
                                          float* tile, int stride) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = warp; k < kKeyTile; k += kChunkWarps) {
    float* row = tile + k * stride;
    if ((wanted >> k) & 1u) {
      for (int i = lane; i < kv.head_dim; i += 32) row[i] = kv_load(kv, value, rows[k], i);
    } else {
      for (int i = lane; i < kv.head_dim; i += 32) row[i] = 0.0f;
    }
  }
}

// Block (x, kv head, span) attends its queries (Tiles: ScanTiles, a tile of consecutive queries from the last;
// GatheredTiles, one query) for the q heads of one kv head over the K/V tiles its walker gives: rows = queries
// x group, row (query i, head g) = i * group + g, owned by warp row % 8. With one span it writes the gated
// outputs, else each row's online-softmax partial for attention_chunk_merge_kernel (attention_decode's layout,
// per query: [T][n_head][spans]). In a tile, lane k scores token k for the warp's rows (the scores stay in the
// warp: an online softmax with warp reductions), then each lane accumulates head dims lane + 32 c of the
// weighted values. kDims: dims per lane (head_dim <= 32 kDims); kRows: rows per warp, kDims * kRows <=
// kAccumulators registers.
template <int kDims, int kRows, class Tiles>
__global__ void __launch_bounds__(kChunkThreads)
    attention_chunk_kernel(AttentionShape shape, AttentionChunkArgs args, int tokens, int tile_queries, PagedKv kv) {
  await_producers();
  release_consumers();
  static_assert(kDims * kRows <= kAccumulators, "each thread holds at most kAccumulators output sums");
  extern __shared__ float4 shared_vec[];  // float4: the q rows and K tile are read as float4
  __shared__ TileSlots slots;
  const int d = shape.head_dim, group = shape.n_head / shape.n_head_kv;
  const int rows = tile_queries * group, stride = d + 4;  // the pad spreads a float4 column over the banks
  float* q_rows = reinterpret_cast<float*>(shared_vec);   // [rows][d]; at the end the outputs
  float* tile = q_rows + rows * d;                         // [kKeyTile][stride]: K, then V of the same tokens
  float* weights = tile + kKeyTile * stride;               // [rows][kKeyTile]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kvh = blockIdx.y;
  const int first_query = (gridDim.x - 1 - blockIdx.x) * tile_queries;  // the longest walks start first
  const int dims = d / 32;
  const int my_rows = warp < rows ? (rows - 1 - warp) / kChunkWarps + 1 : 0;

  for (int e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int row = e / d, t = first_query + row / group, h = kvh * group + row % group;
    q_rows[e] = t < tokens ? args.q[(static_cast<long>(t) * shape.n_head + h) * d + e % d] : 0.0f;
  }
  Tiles tiles(args, tokens, first_query, tile_queries, slots);
  float m[kRows], l[kRows], acc[kRows][kDims];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDims; ++c) acc[rr][c] = 0.0f;
  }
  const float scale = rsqrtf(static_cast<float>(d));
  __syncthreads();

  while (tiles.next(kv, kvh, slots)) {
    unsigned wanted = 0;
    for (int i = 0; i < tile_queries; ++i) wanted |= slots.mask[i];
    load_tile(kv, false, slots.rows, wanted, tile, stride);
    __syncthreads();

    float s[kRows];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) s[rr] = 0.0f;
    for (int i = 0; i < d; i += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(tile + lane * stride + i);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        if (rr >= my_rows) break;
        const float4 q4 = *reinterpret_cast<const float4*>(q_rows + (warp + kChunkWarps * rr) * d + i);
        s[rr] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {  // the online softmax step of each row over this tile
      if (rr >= my_rows) break;
      const int row = warp + kChunkWarps * rr;
      const bool attended = (slots.mask[row / group] >> lane) & 1u;
      const float score = attended ? s[rr] * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(score));
      // A row may attend nothing in a tile, or in the tiles so far (m_new = -inf): nothing to rescale then.
      const float correction = m_new == -INFINITY ? 1.0f : __expf(m[rr] - m_new);
      const float w = attended ? __expf(score - m_new) : 0.0f;
      l[rr] = l[rr] * correction + warp_sum(w);
      m[rr] = m_new;
      weights[row * kKeyTile + lane] = w;
#pragma unroll
      for (int c = 0; c < kDims; ++c) acc[rr][c] *= correction;
    }
    __syncthreads();  // K consumed by every warp; the weights written
    load_tile(kv, true, slots.rows, wanted, tile, stride);
    __syncthreads();
    for (int k = 0; k < kKeyTile; ++k) {
      float v[kDims];
#pragma unroll
      for (int c = 0; c < kDims; ++c) v[c] = c < dims ? tile[k * stride + lane + 32 * c] : 0.0f;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        if (rr >= my_rows) break;
        const float w = weights[(warp + kChunkWarps * rr) * kKeyTile + k];
#pragma unroll
        for (int c = 0; c < kDims; ++c) acc[rr][c] += w * v[c];
      }
    }
  }

  const int spans = gridDim.z;
  if (spans > 1) {
    const long parts = static_cast<long>(tokens) * shape.n_head * spans;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      if (rr >= my_rows) break;
      const int row = warp + kChunkWarps * rr, t = first_query + row / group, h = kvh * group + row % group;
      if (t >= tokens) continue;
      const long part = (static_cast<long>(t) * shape.n_head + h) * spans + blockIdx.z;
      if (lane == 0) {
        args.scratch[part] = m[rr];
        args.scratch[parts + part] = l[rr];
      }
#pragma unroll
      for (int c = 0; c < kDims; ++c)
        if (c < dims) args.scratch[2 * parts + part * d + lane + 32 * c] = acc[rr][c];
    }
    return;
  }
  // Each warp writes its own rows over their q rows (only it reads them), normalised as attention_merge does.
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    if (rr >= my_rows) break;
    const int row = warp + kChunkWarps * rr;
#pragma unroll
    for (int c = 0; c < kDims; ++c)
      if (c < dims) q_rows[row * d + lane + 32 * c] = l[rr] > 0.0f ? acc[rr][c] / l[rr] : 0.0f;
  }
  __syncthreads();
  if (kv_rotated(kv.values.codes)) kv_rotate_rows_in_place(q_rows, rows, d);  // back to the model's basis
  for (int e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int row = e / d, i = e % d, t = first_query + row / group, h = kvh * group + row % group;
    if (t >= tokens) continue;
    const float gate = args.q_gate[t * args.q_gate_stride + static_cast<long>(h) * 2 * d + d + i];
    args.out[(static_cast<long>(t) * shape.n_head + h) * d + i] = q_rows[e] * attention_sigmoid(gate);
  }
}

// Block (head, query): the query's spans merged, rotated back and gated, as attention_decode's merge does.
__global__ void attention_chunk_merge_kernel(AttentionShape shape, AttentionChunkArgs args, int tokens, int spans,
                                             PagedKv kv) {
  await_producers();
  release_consumers();
  __shared__ float a[kMaxHeadDim];
  const int d = shape.head_dim, h = blockIdx.x, t = blockIdx.y;
  const long parts = static_cast<long>(tokens) * shape.n_head * spans;
  const AttentionPartials partials{args.scratch, args.scratch + parts, args.scratch + 2 * parts};
  const long head = static_cast<long>(t) * shape.n_head + h;
  attention_merge_head(partials, head * spans, spans, d, kv,
                       args.q_gate + t * args.q_gate_stride + static_cast<long>(h) * 2 * d + d, args.out + head * d, a);
}

// A kernel instance and the rows one block of it holds (kChunkWarps x its rows per warp).
struct ChunkKernel {
  void (*kernel)(AttentionShape, AttentionChunkArgs, int, int, PagedKv) = nullptr;
  int capacity = 0;
};

template <int kDims, int kRows, class Tiles>
ChunkKernel instance() {
  return {attention_chunk_kernel<kDims, kRows, Tiles>, kChunkWarps * kRows};
}

// The instance for head_dim with at most kMaxRows rows per warp, else as many as kAccumulators registers allow.
template <class Tiles, int kMaxRows>
ChunkKernel instance_for(int head_dim) {
  const int dims = head_dim / 32;
  if (dims <= 2) return instance<2, std::min(16, kMaxRows), Tiles>();
  if (dims <= 4) return instance<4, std::min(16, kMaxRows), Tiles>();
  if (dims <= 8) return instance<8, std::min(8, kMaxRows), Tiles>();
  return instance<16, std::min(4, kMaxRows), Tiles>();
}

// The scan holds as many query rows as the registers allow. A gathered block holds one query's q heads: up to
// 16 of them (qwen3next's 8, qwen4exp's 12) in two rows per warp, whose fewer registers leave room for more
// blocks per SM.
ChunkKernel chunk_kernel(const AttentionShape& shape, bool gathered) {
  if (!gathered) return instance_for<ScanTiles, 16>(shape.head_dim);
  if (shape.n_head / shape.n_head_kv <= 2 * kChunkWarps) return instance_for<GatheredTiles, 2>(shape.head_dim);
  return instance_for<GatheredTiles, 16>(shape.head_dim);
}

size_t chunk_smem_bytes(const AttentionShape& shape, int tile_queries) {
  const size_t rows = static_cast<size_t>(tile_queries) * (shape.n_head / shape.n_head_kv);
  const size_t d = shape.head_dim;
  return sizeof(float) * (rows * d + kKeyTile * (d + 4) + rows * kKeyTile);
}

// The dynamic shared memory one block may have on the current device (0 if it cannot be asked).
size_t device_smem_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;
  constexpr size_t kStaticSmem = sizeof(TileSlots);
  return static_cast<size_t>(bytes) > kStaticSmem ? static_cast<size_t>(bytes) - kStaticSmem : 0;
}

// Queries per block where shared memory is no limit: as many as the rows and kMaxTileQueries allow (each
// shares every K/V tile load). 0 if one query's rows do not fit.
int full_tile_queries(const AttentionShape& shape) {
  return std::min(kMaxTileQueries, chunk_kernel(shape, false).capacity / (shape.n_head / shape.n_head_kv));
}

// Queries per block on the current device, no more than the chunk has; 0 if one query's rows do not fit.
int tile_queries(const AttentionShape& shape, int tokens) {
  int queries = std::min(full_tile_queries(shape), tokens);
  const size_t limit = device_smem_limit();
  while (queries > 0 && chunk_smem_bytes(shape, queries) > limit) --queries;
  return queries;
}

// Spans per query: 1 once the chunk's blocks (its full query tiles in the scan, its queries when gathered)
// make kTargetBlocks, else enough to (up to kMaxSplits). It counts full tiles, so the scratch a chunk needs
// does not depend on the device.
int chunk_spans(const AttentionShape& shape, int tokens, bool gathered) {
  const int per_block = gathered ? 1 : std::max(full_tile_queries(shape), 1);
  const long blocks = static_cast<long>((tokens + per_block - 1) / per_block) * shape.n_head_kv;
  return static_cast<int>(std::clamp(kTargetBlocks / blocks, 1L, static_cast<long>(kMaxSplits)));
}

}  // namespace

cudaError_t attention_prep_chunk(const AttentionShape& shape, const AttentionChunkPrepArgs& args, int tokens,
                                 const PagedKv& kv, cudaStream_t stream) {
  const long heads_dim = static_cast<long>(shape.n_head) * shape.head_dim;
  const long kv_dim = static_cast<long>(shape.n_head_kv) * shape.head_dim;
  if (!valid_attention(shape, kv) || tokens <= 0 || tokens > 65535 || args.q_gate_stride < 2 * heads_dim ||
      args.k_stride < kv_dim || args.v_stride < kv_dim || args.q_gate == nullptr || args.k == nullptr ||
      args.v == nullptr || args.q_norm == nullptr || args.k_norm == nullptr || args.rope_cos == nullptr ||
      args.rope_sin == nullptr || args.positions == nullptr || args.q_out == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim) * sizeof(float);
  const dim3 grid(shape.n_head + 2 * shape.n_head_kv, tokens);
  return launch(attention_prep_chunk_kernel, grid, kPrepThreads, smem, stream, shape, args, kv);
}

int attention_chunk_spans(const AttentionShape& shape, int tokens, bool gathered) {
  if (tokens <= 0 || shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0 ||
      shape.head_dim <= 0)
    return 0;
  return chunk_spans(shape, tokens, gathered);
}

std::size_t attention_chunk_scratch_floats(const AttentionShape& shape, int tokens) {
  // Either mode's: the session sizes the scratch once and sets the mode per chunk.
  const int spans = std::max(attention_chunk_spans(shape, tokens, false), attention_chunk_spans(shape, tokens, true));
  if (spans <= 1) return 0;
  return static_cast<std::size_t>(tokens) * shape.n_head * spans * (shape.head_dim + 2);
}

bool attention_chunk_fits(const AttentionShape& shape) {
  return attention_decode_fits(shape) && shape.head_dim > 0 && shape.head_dim <= kMaxHeadDim &&
         tile_queries(shape, 1) > 0;
}

cudaError_t attention_chunk(const AttentionShape& shape, const AttentionChunkArgs& args, int tokens,
                            const PagedKv& kv, cudaStream_t stream) {
  const bool sparse = args.selected_blocks != nullptr;
  if (!valid_attention(shape, kv) || !attention_chunk_fits(shape) || tokens <= 0 || args.block_tokens <= 0 ||
      sparse != (args.n_selected != nullptr) || (sparse && args.selection_stride <= 0) || args.q == nullptr ||
      args.q_gate == nullptr || args.positions == nullptr || args.out == nullptr ||
      args.q_gate_stride < 2L * shape.n_head * shape.head_dim)
    return cudaErrorInvalidValue;
  const int queries = args.gathered ? 1 : tile_queries(shape, tokens);
  const int spans = chunk_spans(shape, tokens, args.gathered);
  if (spans > 1 && (args.scratch == nullptr || tokens > 65535)) return cudaErrorInvalidValue;
  const ChunkKernel k = chunk_kernel(shape, args.gathered);
  const size_t smem = chunk_smem_bytes(shape, queries);
  const cudaError_t set = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (set != cudaSuccess) return set;
  const dim3 grid((tokens + queries - 1) / queries, shape.n_head_kv, spans);
  const cudaError_t launched = launch(k.kernel, grid, kChunkThreads, smem, stream, shape, args, tokens, queries, kv);
  if (launched != cudaSuccess || spans == 1) return launched;
  const dim3 heads(shape.n_head, tokens);
  return launch(attention_chunk_merge_kernel, heads, kMergeThreads, 0, stream, shape, args, tokens, spans, kv);
}

}  // namespace strata::kernels
