#include <math.h>

#include "attention.cuh"
#include "attention_rows.cuh"
#include "launch.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kDecodeThreads = 256;
constexpr int kSplitHeads = 4;        // q heads per split block: GQA groups are cut into blocks of this many
constexpr int kSplitRuns = 8;         // runs of 4 elements of a K or V row per thread of the split kernel
constexpr int kSpanQuantum = 32;      // spans are whole multiples of this many tokens (of either tile size)
constexpr int kMergeThreads = 128;
constexpr size_t kMaxSplitSmem = 48 * 1024;  // the default dynamic shared memory limit: no opt-in needed

__global__ void attention_prep_kernel(AttentionShape shape, AttentionPrepArgs args, PagedKv kv) {
  await_producers();
  release_consumers();
  extern __shared__ float row[];
  const PrepTokenRows rows{args.q_gate, args.k, args.v, args.q_out};
  attention_prep_head(shape, blockIdx.x, *args.position, rows, args.q_norm, args.k_norm, args.rope_cos,
                      args.rope_sin, kv, row);
}

// `kv`, its pointers offsets into an arena, in the arena of `span` (kernels/state_spans.cuh).
__device__ __forceinline__ PagedKv kv_of(PagedKv kv, const StateSpan& span) {
  kv.keys.data = in_arena(kv.keys.data, span.state);
  if (kv.keys.codes != KvCodes::Bf16) kv.keys.scale = in_arena(kv.keys.scale, span.state);
  kv.values.data = in_arena(kv.values.data, span.state);
  if (kv.values.codes != KvCodes::Bf16) kv.values.scale = in_arena(kv.values.scale, span.state);
  kv.page_table = in_arena(kv.page_table, span.state);
  return kv;
}

// Block (b, r): attention_prep_kernel's block b for row r.
__global__ void attention_prep_rows_kernel(AttentionShape shape, AttentionPrepArgs args, PagedKv kv,
                                           AttentionRows rows) {
  await_producers();
  release_consumers();
  extern __shared__ float row[];
  const int r = blockIdx.y;
  const long heads = static_cast<long>(shape.n_head) * shape.head_dim;
  const long kv_width = static_cast<long>(shape.n_head_kv) * shape.head_dim;
  const PrepTokenRows own{args.q_gate + r * 2 * heads, args.k + r * kv_width, args.v + r * kv_width,
                          args.q_out + r * heads};
  attention_prep_head(shape, blockIdx.x, rows.positions[r], own, args.q_norm, args.k_norm, args.rope_cos,
                      args.rope_sin, kv_of(kv, row_span(rows.spans, r, rows.rows)), row);
}

// How this token's attended tokens are cut into spans: `count` tokens in attended_token's order, spans of
// `span` tokens, the first `spans` of the kDecodeSplits holding any. The split and the merge kernels both
// derive it from the position and the selection count in device memory.
struct DecodeSpans {
  int count, span, spans;
};

__device__ __forceinline__ DecodeSpans decode_spans(const AttentionDecodeArgs& args) {
  const int n = *args.position + 1, r = args.block_tokens;
  const int count = args.selected_blocks != nullptr ? *args.n_selected * r + (n - n / r * r) : n;
  const int even = (count + kDecodeSplits - 1) / kDecodeSplits;
  const int span = (even + kSpanQuantum - 1) / kSpanQuantum * kSpanQuantum;
  return {count, span, (count + span - 1) / span};
}

// Flash decoding: the attended tokens are cut into up to kDecodeSplits spans; block (kv head x head chunk,
// span) reads its span's K and V for kSplitHeads q heads that share the kv head (GQA) and leaves an
// online-softmax partial (max, sum, unnormalised accumulator) per q head; attention_merge_kernel combines the
// spans. A tile is kTile tokens, kLanes threads per token: each thread fetches its runs of 4 elements of the
// token's K and V row with one load each, all in flight together, and the row of its next tile's token is
// looked up while they land (the selection, then the page table), so a tile costs about one memory latency.
// The K runs stay in registers (the q.k partial sums meet in a shuffle over the token's lanes); the V runs go
// to shared memory, where each thread sums its own outputs over the tile's tokens. Reading the tile element by
// element, each read behind its own page-table (and selection) lookup, cost ~40 us for a single 16-token tile.
template <int kLanes>
__device__ __forceinline__ void attention_split(const AttentionShape& shape, const AttentionDecodeArgs& args,
                                                const PagedKv& kv) {
  constexpr int kTile = kDecodeThreads / kLanes;
  constexpr int kOut = kSplitHeads * 4 * kSplitRuns * kLanes / kDecodeThreads;  // outputs per thread, at most
  extern __shared__ float4 shared4[];
  float* q = reinterpret_cast<float*>(shared4);    // [kSplitHeads][d]
  float* tile_v = q + kSplitHeads * shape.head_dim;  // [kTile][d]
  float* p = tile_v + kTile * shape.head_dim;        // [kSplitHeads][kTile]: scores, then weights
  float* correction = p + kSplitHeads * kTile;       // [kSplitHeads] this tile's rescale of the accumulators
  const int d = shape.head_dim, group = shape.n_head / shape.n_head_kv;
  const int chunks = (group + kSplitHeads - 1) / kSplitHeads;
  const int kvh = blockIdx.x / chunks, h0 = kvh * group + blockIdx.x % chunks * kSplitHeads;
  const int heads = min(kSplitHeads, (kvh + 1) * group - h0);
  const DecodeSpans spans = decode_spans(args);
  const int first = blockIdx.y * spans.span, last = min(spans.count, first + spans.span);
  if (first >= last) return;  // an idle span: the merge reads only the first spans.spans

  const int n = *args.position + 1, r = args.block_tokens;
  const bool sparse = args.selected_blocks != nullptr;
  const int complete = sparse ? n / r : 0, chosen_tokens = sparse ? *args.n_selected * r : 0;
  const int token = threadIdx.x / kLanes, lane = threadIdx.x % kLanes, warp = threadIdx.x >> 5;
  const auto row_of = [&](int idx) -> long {
    return idx < last ? kv_row(kv, attended_token(idx, sparse, args.selected_blocks, chosen_tokens, complete, r), kvh)
                      : -1;
  };
  long row = row_of(first + token);  // its lookups in flight while q is read
  for (int i = threadIdx.x; i < kSplitHeads * d; i += blockDim.x)
    q[i] = i < heads * d ? args.q[static_cast<long>(h0) * d + i] : 0.0f;
  float m = -INFINITY, l = 0.0f;  // warp g < heads: head g's running max and sum
  float acc[kOut];
#pragma unroll
  for (int j = 0; j < kOut; ++j) acc[j] = 0.0f;
  const float scale = rsqrtf(static_cast<float>(d));
  __syncthreads();  // q

  for (int t0 = first; t0 < last; t0 += kTile) {
    KvChunks<kSplitRuns> k_runs, v_runs;
    kv_fetch_chunks(kv.keys, d, row, lane, kLanes, k_runs);
    kv_fetch_chunks(kv.values, d, row, lane, kLanes, v_runs);
    const bool valid = row >= 0;
    row = row_of(t0 + kTile + token);
    float dot[kSplitHeads] = {};
#pragma unroll
    for (int j = 0; j < kSplitRuns; ++j) {
      const int e = 4 * (lane + kLanes * j);
      if (e >= d) break;
      const float4 k4 = kv_decode_chunk(kv.keys.codes, k_runs, j);
#pragma unroll
      for (int g = 0; g < kSplitHeads; ++g) {
        const float4 q4 = *reinterpret_cast<const float4*>(q + g * d + e);
        dot[g] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
      }
    }
#pragma unroll
    for (int g = 0; g < kSplitHeads; ++g)
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
    __syncthreads();  // the previous tile's V and weights consumed
    if (lane == 0)
#pragma unroll
      for (int g = 0; g < kSplitHeads; ++g) p[g * kTile + token] = valid ? dot[g] * scale : -INFINITY;
#pragma unroll
    for (int j = 0; j < kSplitRuns; ++j) {
      const int e = 4 * (lane + kLanes * j);
      if (e >= d) break;
      *reinterpret_cast<float4*>(tile_v + token * d + e) = kv_decode_chunk(kv.values.codes, v_runs, j);
    }
    __syncthreads();
    if (warp < heads) {  // the online softmax step of head `warp` over this tile
      const float s = threadIdx.x % 32 < kTile ? p[warp * kTile + threadIdx.x % 32] : -INFINITY;
      const float m_new = fmaxf(m, warp_max(s));
      const float w = s == -INFINITY ? 0.0f : __expf(s - m_new);
      if (threadIdx.x % 32 < kTile) p[warp * kTile + threadIdx.x % 32] = w;
      const float c = __expf(m - m_new);  // 0 on the first tile (m = -inf)
      l = l * c + warp_sum(w);
      m = m_new;
      if (threadIdx.x % 32 == 0) correction[warp] = c;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      const int o = threadIdx.x + j * kDecodeThreads;  // output (head g, dim i) of this thread
      if (o >= heads * d) break;
      const int g = o / d, i = o % d;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kTile; ++t) sum += p[g * kTile + t] * tile_v[t * d + i];
      acc[j] = acc[j] * correction[g] + sum;
    }
  }
  const long part = static_cast<long>(h0) * kDecodeSplits + blockIdx.y;  // partial of q head h0
  if (warp < heads && threadIdx.x % 32 == 0) {
    args.partial_max[part + warp * kDecodeSplits] = m;
    args.partial_sum[part + warp * kDecodeSplits] = l;
  }
#pragma unroll
  for (int j = 0; j < kOut; ++j) {
    const int o = threadIdx.x + j * kDecodeThreads;
    if (o >= heads * d) break;
    args.partial_acc[(part + (o / d) * kDecodeSplits) * d + o % d] = acc[j];
  }
}

template <int kLanes>
__global__ void __launch_bounds__(kDecodeThreads) attention_split_kernel(AttentionShape shape,
                                                                          AttentionDecodeArgs args, PagedKv kv) {
  await_producers();
  release_consumers();
  attention_split<kLanes>(shape, args, kv);
}

// Row r's decode arguments (attention_decode_rows): its position, selection, partials and rows of q, q_gate, out.
__device__ __forceinline__ AttentionDecodeArgs row_args(const AttentionShape& shape, AttentionDecodeArgs args,
                                                        int selection_stride, const AttentionRows& rows, int r) {
  const long heads = static_cast<long>(shape.n_head) * shape.head_dim;
  const long partials = static_cast<long>(shape.n_head) * kDecodeSplits;
  args.position = rows.positions + r;
  if (args.selected_blocks) {
    args.selected_blocks += static_cast<long>(r) * selection_stride;
    args.n_selected += r;
  }
  args.partial_max += r * partials * (shape.head_dim + 2);
  args.partial_sum += r * partials * (shape.head_dim + 2);
  args.partial_acc += r * partials * (shape.head_dim + 2);
  args.q += r * heads;
  args.q_gate += r * 2 * heads;
  args.out += r * heads;
  args.out_q8 = q8_offset(args.out_q8, r * heads);
  return args;
}

// Blocks (x, split, r): attention_split_kernel's block (x, split) for row r.
template <int kLanes>
__global__ void __launch_bounds__(kDecodeThreads) attention_split_rows_kernel(AttentionShape shape,
                                                                               AttentionDecodeArgs args,
                                                                               int selection_stride, PagedKv kv,
                                                                               AttentionRows rows) {
  await_producers();
  release_consumers();
  const int r = blockIdx.z;
  attention_split<kLanes>(shape, row_args(shape, args, selection_stride, rows, r),
                          kv_of(kv, row_span(rows.spans, r, rows.rows)));
}

// One block per q head: the active spans' partials combined, normalised, rotated back and gated (and quantized
// where asked: head_dim is whole blocks).
__device__ __forceinline__ void attention_merge(const AttentionShape& shape, const AttentionDecodeArgs& args,
                                                const PagedKv& kv) {
  __shared__ float a[kMaxHeadDim];
  const int d = shape.head_dim, h = blockIdx.x;
  const AttentionPartials partials{args.partial_max, args.partial_sum, args.partial_acc};
  attention_merge_head(partials, static_cast<long>(h) * kDecodeSplits, decode_spans(args).spans, d, kv,
                       args.q_gate + static_cast<long>(h) * 2 * d + d, args.out + h * d, a,
                       q8_offset(args.out_q8, static_cast<long>(h) * d));
}

__global__ void attention_merge_kernel(AttentionShape shape, AttentionDecodeArgs args, PagedKv kv) {
  await_producers();
  release_consumers();
  attention_merge(shape, args, kv);
}

// Blocks (h, r): attention_merge_kernel's block h for row r.
__global__ void attention_merge_rows_kernel(AttentionShape shape, AttentionDecodeArgs args, int selection_stride,
                                            PagedKv kv, AttentionRows rows) {
  await_producers();
  release_consumers();
  const int r = blockIdx.y;
  attention_merge(shape, row_args(shape, args, selection_stride, rows, r),
                  kv_of(kv, row_span(rows.spans, r, rows.rows)));
}

// Threads per token of the split kernel's tiles: runs of 4 elements, at most kSplitRuns a thread, cover the row.
int split_lanes(int head_dim) { return head_dim <= 4 * kSplitRuns * 8 ? 8 : 16; }

size_t split_smem_bytes(const AttentionShape& shape) {
  const size_t d = shape.head_dim, tile = kDecodeThreads / split_lanes(shape.head_dim);
  return sizeof(float) * (kSplitHeads * d + tile * d + kSplitHeads * tile + kSplitHeads);
}

// What the row launchers require: their cache's pointers are offsets into an arena, which may be null.
bool valid_rows_attention(const AttentionShape& shape, const PagedKv& kv, const AttentionRows& rows) {
  return valid_attention_format(shape, kv) && rows.rows > 0 && rows.positions != nullptr && valid_spans(rows.spans);
}

}  // namespace

cudaError_t attention_prep(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                           cudaStream_t stream) {
  if (!valid_attention(shape, kv)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim) * sizeof(float);
  return launch(attention_prep_kernel, shape.n_head + 2 * shape.n_head_kv, kPrepThreads, smem, stream, shape, args,
                kv);
}

bool attention_decode_fits(const AttentionShape& shape) {
  return shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0 && shape.head_dim > 0 &&
         shape.head_dim % 32 == 0 && shape.head_dim <= kMaxHeadDim && split_smem_bytes(shape) <= kMaxSplitSmem;
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
  const int chunks = (shape.n_head / shape.n_head_kv + kSplitHeads - 1) / kSplitHeads;
  const dim3 grid(shape.n_head_kv * chunks, kDecodeSplits);
  const size_t smem = split_smem_bytes(shape);
  auto* split = split_lanes(shape.head_dim) == 8 ? attention_split_kernel<8> : attention_split_kernel<16>;
  const cudaError_t launched = launch(split, grid, kDecodeThreads, smem, stream, shape, args, kv);
  if (launched != cudaSuccess) return launched;
  return launch(attention_merge_kernel, shape.n_head, kMergeThreads, 0, stream, shape, args, kv);
}

cudaError_t attention_prep_rows(const AttentionShape& shape, const AttentionPrepArgs& args, const PagedKv& kv,
                                const AttentionRows& rows, cudaStream_t stream) {
  if (!valid_rows_attention(shape, kv, rows)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(shape.head_dim) * sizeof(float);
  return launch(attention_prep_rows_kernel, dim3(shape.n_head + 2 * shape.n_head_kv, rows.rows), kPrepThreads, smem,
                stream, shape, args, kv, rows);
}

cudaError_t attention_decode_rows(const AttentionShape& shape, const AttentionDecodeArgs& args, int selection_stride,
                                  const PagedKv& kv, const AttentionRows& rows, cudaStream_t stream) {
  if (!valid_rows_attention(shape, kv, rows) || !attention_decode_fits(shape) || args.block_tokens <= 0 ||
      (args.selected_blocks == nullptr) != (args.n_selected == nullptr) || args.partial_max == nullptr ||
      args.partial_sum == nullptr || args.partial_acc == nullptr || (args.selected_blocks && selection_stride <= 0))
    return cudaErrorInvalidValue;
  const int chunks = (shape.n_head / shape.n_head_kv + kSplitHeads - 1) / kSplitHeads;
  const dim3 grid(shape.n_head_kv * chunks, kDecodeSplits, rows.rows);
  const size_t smem = split_smem_bytes(shape);
  auto* split = split_lanes(shape.head_dim) == 8 ? attention_split_rows_kernel<8> : attention_split_rows_kernel<16>;
  const cudaError_t launched =
      launch(split, grid, kDecodeThreads, smem, stream, shape, args, selection_stride, kv, rows);
  if (launched != cudaSuccess) return launched;
  return launch(attention_merge_rows_kernel, dim3(shape.n_head, rows.rows), kMergeThreads, 0, stream, shape, args,
                selection_stride, kv, rows);
}

}  // namespace strata::kernels
