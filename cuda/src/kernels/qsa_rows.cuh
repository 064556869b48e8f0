// What the decode and chunk QSA kernels share, so a chunk leaves the indexer cache and makes the selections
// exactly as the same tokens decoded one by one would: the block pooling, one block's score and the top-block
// selection (same code, same block sizes, same arithmetic), and the argument checks. Internal to the QSA kernels.
#pragma once

#include "mixer_rows.cuh"
#include "qsa.cuh"

namespace strata::kernels {

// Threads per block of the append, score and selection kernels: the pooled keys' and the scoring queries'
// RMSNorm reduce over the block, so their bits depend on these.
constexpr int kAppendThreads = 128;
constexpr int kScoreThreads = 256;
constexpr int kSelectThreads = 1024;

// Pools block `block` of the raw keys (all of its rows stored) into its block key: mean, k_norm, RoPE at the
// block's first position. shared: 2 * head_dim floats. Each thread reads back only the raw-key columns it
// stores in qsa_store_raw_key, so no barrier is needed between the two.
__device__ __forceinline__ void qsa_pool_block(const IndexerShape& shape, const IndexerCache& cache, int block,
                                               const float* k_norm, const float* rope_cos, const float* rope_sin,
                                               float* shared) {
  float* pooled = shared;
  float* keyed = shared + shape.head_dim;
  const int d = shape.head_dim, r = shape.ratio;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < r; ++j) sum += cache.raw_keys[(static_cast<long>(block) * r + j) * d + i];
    pooled[i] = sum / static_cast<float>(r);
  }
  __syncthreads();
  const int half = shape.rope_dim / 2;
  const long start = static_cast<long>(block) * r;  // RoPE at the block's first position
  norm_rope_row(pooled, k_norm, d, shape.eps, rope_cos + start * half, rope_sin + start * half, half, keyed);
  for (int i = threadIdx.x; i < d; i += blockDim.x) cache.block_keys[static_cast<long>(block) * d + i] = keyed[i];
}

// Row p of the raw keys from kraw [head_dim].
__device__ __forceinline__ void qsa_store_raw_key(const IndexerShape& shape, const IndexerCache& cache, int p,
                                                  const float* kraw) {
  const int d = shape.head_dim;
  for (int i = threadIdx.x; i < d; i += blockDim.x) cache.raw_keys[static_cast<long>(p) * d + i] = kraw[i];
}

// The normed, roped scoring query of position p: q [n_heads][head_dim] into dst (shared memory). Every thread
// of a kScoreThreads block calls it.
__device__ __forceinline__ void qsa_score_query(const IndexerShape& shape, const float* q, const float* q_norm,
                                                const float* rope_cos, const float* rope_sin, int p, float* dst) {
  const int d = shape.head_dim, half = shape.rope_dim / 2;
  for (int h = 0; h < shape.n_heads; ++h)
    norm_rope_row(q + h * d, q_norm, d, shape.eps, rope_cos + static_cast<long>(p) * half,
                  rope_sin + static_cast<long>(p) * half, half, dst + h * d);
}

// sum_h relu(q_h . key) / sqrt(head_dim) for the scoring query q [n_heads][head_dim]; one warp, every lane
// gets it.
__device__ __forceinline__ float qsa_block_score(const IndexerShape& shape, const float* q, const float* key) {
  const int d = shape.head_dim, lane = threadIdx.x & 31;
  float total = 0.0f;
  for (int h = 0; h < shape.n_heads; ++h) {
    float dot = 0.0f;
    for (int i = lane; i < d; i += 32) dot += q[h * d + i] * key[i];
    total += fmaxf(warp_sum(dot), 0.0f);
  }
  return total * rsqrtf(static_cast<float>(d));
}

// Order-preserving map of a float to uint32 (larger float, larger key); -0 and +0 map together.
__device__ __forceinline__ unsigned order_key(float x) {
  const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Scores the selection keeps in shared memory as order keys (32 KiB), so its passes read them there: the first
// kCachedKeys blocks (a context of 32,768 tokens at 4 tokens a block); blocks past them are re-read per pass.
constexpr int kCachedKeys = 8192;

// The selection of a query that sees n_blocks complete blocks with scores[0:n_blocks]: *n_selected =
// keep = min(keep_blocks, n_blocks) and selected[0:keep] ascending; all blocks when they fit, else radix-select
// the keep-th largest score (8 bits per pass), then every block above it and the lowest-indexed blocks equal to
// it. Every thread of a kSelectThreads block calls it; the selection depends on the scores alone.
//
// Deep in a long context (65,536 blocks at 262K tokens) this runs once per attention layer and token, so its
// work is kept to reads of the scores: a pass's histogram takes one shared atomic per run of equal digits in a
// warp (the top digits of nearby scores mostly agree, and one atomic per score on one bin serialises the whole
// block), and the final pass walks each warp's contiguous range twice with ballots (its counts, then its
// writes) instead of a block-wide scan per 1,024 scores. The passes are latency-bound chains, so each is kept
// short: the keys come from shared memory, the next pass's histogram is cleared during this one (two
// barriers a pass), and one warp finds the digit with a scan over the 256 bins, 8 per lane, where one thread
// walking them from the top took up to 256 dependent steps a pass.
__device__ __forceinline__ void qsa_select_top(int n_blocks, int keep_blocks, const float* scores, int* selected,
                                               int* n_selected) {
  constexpr int kWarps = kSelectThreads / 32;
  __shared__ unsigned keys[kCachedKeys];
  __shared__ int histograms[2][256];
  __shared__ unsigned chosen_prefix;
  __shared__ int still_needed;
  __shared__ int warp_greater[kWarps], warp_equal[kWarps];
  const int keep = min(keep_blocks, n_blocks);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) *n_selected = keep;
  if (keep == n_blocks) {
    for (int b = threadIdx.x; b < n_blocks; b += blockDim.x) selected[b] = b;
    return;
  }
  const int cached = min(n_blocks, kCachedKeys);
  for (int b = threadIdx.x; b < cached; b += blockDim.x) keys[b] = order_key(scores[b]);
  for (int i = threadIdx.x; i < 256; i += blockDim.x) histograms[0][i] = 0;
  __syncthreads();
  const auto key_of = [&](int b) { return b < cached ? keys[b] : order_key(scores[b]); };
  unsigned prefix = 0, mask = 0;
  int needed = keep;
  for (int pass = 0, shift = 24; shift >= 0; ++pass, shift -= 8) {
    int* histogram = histograms[pass & 1];
    int* next = histograms[(pass + 1) & 1];  // the next pass's, cleared while this one counts
    for (int i = threadIdx.x; i < 256; i += blockDim.x) next[i] = 0;
    for (int base = warp * 32; base < n_blocks; base += blockDim.x) {  // whole warps: the match below needs them
      const int b = base + lane;
      const unsigned key = b < n_blocks ? key_of(b) : 0u;
      const bool counted = b < n_blocks && (key & mask) == prefix;
      const unsigned digit = counted ? (key >> shift) & 255u : 256u;  // 256: not counted
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (counted && lane == __ffs(peers) - 1) atomicAdd(&histogram[digit], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {  // the highest bin where the count from the top reaches `needed`: lane l owns 255 - 8l ..
      int own = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) own += histogram[255 - 8 * lane - k];
      int from_top = own;  // inclusive scan over the lanes, from the top bins down
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, from_top, offset);
        if (lane >= offset) from_top += up;
      }
      const unsigned reached = __ballot_sync(0xffffffffu, from_top >= needed);  // never empty: see needed
      if (lane == __ffs(reached) - 1) {
        int above = from_top - own, bin = 255 - 8 * lane;
        while (above + histogram[bin] < needed) above += histogram[bin--];
        chosen_prefix = prefix | (static_cast<unsigned>(bin) << shift);
        still_needed = needed - above;
      }
    }
    __syncthreads();  // chosen_prefix and still_needed are rewritten next pass only after its first barrier
    prefix = chosen_prefix;
    needed = still_needed;
    mask |= 255u << shift;
  }

  // prefix is the threshold key; `needed` blocks equal to it are taken, lowest index first. Warp w owns blocks
  // [w * span, (w + 1) * span): its counts, then its place in the output, then its writes.
  const int span = (n_blocks + kWarps - 1) / kWarps;
  const int lo = warp * span, hi = min(n_blocks, lo + span);
  int greater = 0, equal = 0;
  for (int base = lo; base < hi; base += 32) {
    const int b = base + lane;
    const unsigned key = b < hi ? key_of(b) : 0u;
    greater += __popc(__ballot_sync(0xffffffffu, b < hi && key > prefix));
    equal += __popc(__ballot_sync(0xffffffffu, b < hi && key == prefix));
  }
  if (lane == 0) {
    warp_greater[warp] = greater;
    warp_equal[warp] = equal;
  }
  __syncthreads();
  int equal_before = 0, written = 0;  // over the warps before this one
  for (int w = 0; w < warp; ++w) {
    written += warp_greater[w] + max(0, min(warp_equal[w], needed - equal_before));
    equal_before += warp_equal[w];
  }
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
  for (int base = lo; base < hi; base += 32) {
    const int b = base + lane;
    const unsigned key = b < hi ? key_of(b) : 0u;
    const unsigned equals = __ballot_sync(0xffffffffu, b < hi && key == prefix);
    const bool take = b < hi && (key > prefix || (key == prefix && equal_before + __popc(equals & below) < needed));
    const unsigned takes = __ballot_sync(0xffffffffu, take);
    if (take) selected[written + __popc(takes & below)] = b;
    written += __popc(takes);
    equal_before += __popc(equals);
  }
}

inline bool valid_indexer_append(const IndexerShape& shape) {
  return shape.head_dim > 0 && shape.ratio > 0 && shape.rope_dim % 2 == 0 && shape.rope_dim <= shape.head_dim;
}

inline bool valid_indexer_select(const IndexerShape& shape) {
  return shape.n_heads > 0 && shape.keep_blocks > 0 && shape.max_blocks > 0 && valid_indexer_append(shape);
}

}  // namespace strata::kernels
