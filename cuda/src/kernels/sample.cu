// Token sampling (see sample.cuh). Three steps on the stream, all sized by the host-known vocab:
//  1. a 64-bit sort key per logit: each logit biased and masked, then the seen ids' rewritten from their logits
//     after every adjustment (the bias, the repetition penalty, the answer's counts, the mask),
//  2. a CUB radix sort of the keys: the candidates by logit descending, ties to the lower id,
//  3. one CTA walks the sorted prefix: greedy, or top-k, float64 softmax, top-p, min-p and the draw.
// The argmax (sample_argmax) needs only the smallest key of step 1: a reduction over many CTAs, no sort. A mask
// published after the launch is waited for before step 1, the first to read it on both paths (mask_wait_kernel).
// Probabilities are recomputed from the sorted keys in each pass rather than stored: the same instructions on
// the same inputs give the same float64 values, so the passes agree with each other exactly.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>

#include "host_poll.cuh"
#include "launch.cuh"
#include "sample.cuh"

namespace strata::kernels {
namespace {

using Key = unsigned long long;

constexpr int kKeyThreads = 256;
constexpr int kPenaltyThreads = 256;
constexpr int kMaxPenaltyBlocks = 64;
constexpr int kDrawThreads = 512;
constexpr int kDrawItems = 8;  // consecutive candidates per thread in one scan tile
constexpr int kDrawTile = kDrawThreads * kDrawItems;
constexpr int kMinThreads = 256;
constexpr int kMinItems = 8;  // keys per thread of the smallest-key reduction
constexpr int kMinTile = kMinThreads * kMinItems;
constexpr std::size_t kScratchAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// An ascending sort of these keys orders the candidates by logit descending with ties to the lower id.
// High 32 bits: the logit's bits mapped so that a larger float gives a smaller value (-0 and +0 alike, as
// numpy compares them); low 32 bits: the id. Keys are unique, so the order never depends on sort stability.
__device__ __forceinline__ Key make_key(float logit, int id) {
  const unsigned bits = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  const unsigned ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<Key>(~ascending) << 32) | static_cast<unsigned>(id);
}

__device__ __forceinline__ int key_id(Key key) { return static_cast<int>(key & 0xffffffffull); }

// The (penalised) logit of a key; the inverse of make_key's mapping.
__device__ __forceinline__ float key_logit(Key key) {
  const unsigned ascending = ~static_cast<unsigned>(key >> 32);
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}

__device__ __forceinline__ bool allowed(const unsigned* mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

// Where the draw's mask is published after the launch (`mask_ticket` nonzero), waits until it is, in one thread:
// the kernels after it, which read the words, start once it has completed. One waiter, not one in each CTA of the
// key kernel: hundreds of waiters, each a read of host memory and a system-scope fence, cost ~0.9 ms a draw on an
// H100 with the mask published before the launch. A wait that gives up after timeout_ns writes the ticket into
// `late`, for the host to see after the draw.
__global__ void mask_wait_kernel(const SampleParams* __restrict__ params, MaskPublication m) {
  await_producers();
  release_consumers();
  const unsigned ticket = params->mask_ticket;
  if (ticket == 0) return;
  const volatile unsigned* ready = m.ready;
  if (!poll_until([&] { return *ready == ticket; }, m.timeout_ns)) *static_cast<volatile unsigned*>(m.late) = ticket;
  __threadfence_system();  // acquire: the words are read (by the kernels after this one) after the ticket was seen
}

// The answer's ids, seen_ids[answer_start:n_seen] (clamped to max_seen), for the two penalties.
struct AnswerRange {
  int first, end;
};
__device__ __forceinline__ AnswerRange answer_range(const SampleParams& p, int max_seen) {
  const int end = min(p.n_seen, max_seen);
  return {min(max(p.answer_start, 0), end), end};
}

// The logit strata.sampling draws from for `id`, in its order and its float32 / float64 arithmetic: the bias,
// then (`seen`) the repetition penalty and the answer's counts, then the mask (-inf: no candidate, sorted last).
// Every write of an id's key computes this from the original logit, so concurrent writes for one id agree and
// an id seen several times is penalised once.
__device__ __forceinline__ float adjusted_logit(const float* logits, int id, const SampleParams& p,
                                                const SampleInputs& in, bool seen) {
  float x = logits[id];
  if (p.biased) x += in.bias[id];
  if (seen) {
    const float penalty = p.repeat_penalty;
    if (penalty != 1.0f) x = x > 0.0f ? x / penalty : x * penalty;
    if (counts_answer(p)) {
      const int count = in.counts[id];
      // numpy's (count * frequency + presence).astype(float32), rounded apart (no fused multiply-add)
      if (count > 0) x -= static_cast<float>(__dadd_rn(__dmul_rn(count, p.frequency_penalty), p.presence_penalty));
    }
  }
  if (p.masked && !allowed(in.mask, id)) x = -INFINITY;
  return x;
}

// Every logit's key, as for an id neither seen nor in the answer (the penalty kernel rewrites those), and the
// answer's ids counted into inputs.counts for the penalty kernel. `ticket` (null on the sort's path): the
// smallest-key reduction's, zeroed here for the launch after this one.
__global__ void key_kernel(const float* __restrict__ logits, int vocab, const int* __restrict__ seen_ids,
                           int max_seen, const SampleParams* __restrict__ params, SampleInputs inputs,
                           Key* __restrict__ keys, unsigned* ticket) {
  await_producers();
  release_consumers();
  const SampleParams& p = *params;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < vocab) keys[i] = make_key(adjusted_logit(logits, i, p, inputs, false), i);
  if (ticket != nullptr && i == 0) *ticket = 0;
  if (!counts_answer(p)) return;
  const AnswerRange answer = answer_range(p, max_seen);
  for (int k = answer.first + i; k < answer.end; k += gridDim.x * blockDim.x) {
    const int id = seen_ids[k];
    if (id >= 0 && id < vocab) atomicAdd(inputs.counts + id, 1);
  }
}

// Rewrites the keys of the seen ids (of the answer's only, where only the two penalties need them) from their
// adjusted logits. The float32 division and product are the reference's (numpy computes float32 logits with the
// penalty cast to float32).
__global__ void penalty_kernel(const float* __restrict__ logits, int vocab, const int* __restrict__ seen_ids,
                               int max_seen, const SampleParams* __restrict__ params, SampleInputs inputs, Key* keys) {
  await_producers();
  release_consumers();
  const SampleParams& p = *params;
  const int n_seen = min(p.n_seen, max_seen);
  const int first = p.repeat_penalty != 1.0f ? 0 : counts_answer(p) ? answer_range(p, max_seen).first : n_seen;
  for (int k = first + blockIdx.x * blockDim.x + threadIdx.x; k < n_seen; k += gridDim.x * blockDim.x) {
    const int id = seen_ids[k];
    if (id < 0 || id >= vocab) continue;
    keys[id] = make_key(adjusted_logit(logits, id, p, inputs, true), id);
  }
}

// The answer's counts back to zero, by the launch after the penalty kernel (thread `thread` of `threads`).
__device__ __forceinline__ void clear_counts(const int* __restrict__ seen_ids, int max_seen, int vocab,
                                             const SampleParams& p, int* counts, int thread, int threads) {
  if (!counts_answer(p)) return;
  const AnswerRange answer = answer_range(p, max_seen);
  for (int k = answer.first + thread; k < answer.end; k += threads) {
    const int id = seen_ids[k];
    if (id >= 0 && id < vocab) counts[id] = 0;
  }
}

using MinReduce = cub::BlockReduce<Key, kMinThreads>;

struct SmallerKey {
  __device__ __forceinline__ Key operator()(Key a, Key b) const { return a < b ? a : b; }
};

// The smallest key, the candidate the sorted order puts first: each CTA's minimum over its tile into
// partial[blockIdx.x], then the CTA that draws the last ticket (zeroed by key_kernel) reduces those.
__global__ void __launch_bounds__(kMinThreads)
    smallest_key_kernel(const Key* __restrict__ keys, int vocab, Key* partial, unsigned* ticket,
                        int* __restrict__ token, const int* __restrict__ seen_ids, int max_seen,
                        const SampleParams* __restrict__ params, int* counts) {
  await_producers();
  release_consumers();
  clear_counts(seen_ids, max_seen, vocab, *params, counts, blockIdx.x * kMinThreads + threadIdx.x,
               gridDim.x * kMinThreads);
  __shared__ MinReduce::TempStorage storage;
  __shared__ bool last;
  const SmallerKey min_of;
  Key best = ~0ull;
  const int end = min(vocab, (blockIdx.x + 1) * kMinTile);
  for (int i = blockIdx.x * kMinTile + threadIdx.x; i < end; i += kMinThreads) best = min_of(best, keys[i]);
  best = MinReduce(storage).Reduce(best, min_of);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = best;
    __threadfence();  // release: the minimum before the ticket
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: the other CTAs' minima after their tickets
  Key all = ~0ull;
  for (int b = threadIdx.x; b < gridDim.x; b += kMinThreads) all = min_of(all, __ldcg(partial + b));
  __syncthreads();  // the CUB storage is reused
  all = MinReduce(storage).Reduce(all, min_of);
  if (threadIdx.x == 0) *token = key_id(all);
}

using DrawScan = cub::BlockScan<double, kDrawThreads>;
using DrawReduce = cub::BlockReduce<double, kDrawThreads>;

struct DrawShared {
  union {
    DrawScan::TempStorage scan;
    DrawReduce::TempStorage reduce;
  } storage;
  double total;
  int index;
};

// value(0) + ... + value(count - 1), returned to every thread.
template <class Value>
__device__ double block_sum_of(int count, Value value, DrawShared& shared) {
  double part = 0.0;
  for (int i = threadIdx.x; i < count; i += kDrawThreads) part += value(i);
  const double total = DrawReduce(shared.storage.reduce).Sum(part);
  if (threadIdx.x == 0) shared.total = total;
  __syncthreads();
  const double all = shared.total;
  __syncthreads();  // shared.total and the CUB storage are reused by the next step
  return all;
}

// The first index i < count whose prefix sum value(0) + ... + value(i) satisfies `crossed`; count if none.
// Tiles of kDrawTile values are scanned in order, each thread owning kDrawItems consecutive indices.
template <class Value, class Crossed>
__device__ int first_crossing(int count, Value value, Crossed crossed, DrawShared& shared) {
  double carry = 0.0;  // the sum of the earlier tiles
  for (int base = 0; base < count; base += kDrawTile) {
    const int first = base + threadIdx.x * kDrawItems;
    double sums[kDrawItems];
#pragma unroll
    for (int j = 0; j < kDrawItems; ++j) sums[j] = first + j < count ? value(first + j) : 0.0;
    if (threadIdx.x == 0) shared.index = count;
    double tile_sum;
    DrawScan(shared.storage.scan).InclusiveSum(sums, sums, tile_sum);
    __syncthreads();  // shared.index reset before any atomicMin
    int mine = count;
#pragma unroll
    for (int j = kDrawItems - 1; j >= 0; --j)
      if (first + j < count && crossed(carry + sums[j])) mine = first + j;
    if (mine < count) atomicMin(&shared.index, mine);
    __syncthreads();
    const int hit = shared.index;
    __syncthreads();  // the next tile resets shared.index and reuses the scan storage
    if (hit < count) return hit;
    carry += tile_sum;
  }
  return count;
}

// The largest index i < count with kept(i) (index 0 is always kept), returned to every thread.
template <class Kept>
__device__ int last_kept(int count, Kept kept, DrawShared& shared) {
  if (threadIdx.x == 0) shared.index = 0;
  __syncthreads();
  int mine = -1;
  for (int i = threadIdx.x; i < count; i += kDrawThreads)
    if (kept(i)) mine = i;
  if (mine > 0) atomicMax(&shared.index, mine);
  __syncthreads();
  const int last = shared.index;
  __syncthreads();
  return last;
}

// One CTA over the sorted keys; each step as in strata.sampling.candidates / sample, in float64.
__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(const Key* __restrict__ sorted, int vocab, const SampleParams* __restrict__ params,
                int* __restrict__ token, const int* __restrict__ seen_ids, int max_seen, int* counts) {
  await_producers();
  release_consumers();
  __shared__ DrawShared shared;
  const SampleParams p = *params;
  clear_counts(seen_ids, max_seen, vocab, p, counts, threadIdx.x, kDrawThreads);
  if (picks_argmax(p)) {  // the first key is the largest logit with the lowest id among ties
    if (threadIdx.x == 0) *token = key_id(sorted[0]);
    return;
  }
  const int n = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;  // top-k keeps a prefix of the order
  // probs[i] = exp(logit_i / T - logit_0 / T) / sum, the reference's float64 softmax over the n candidates.
  const double scaled_first = static_cast<double>(key_logit(sorted[0])) / p.temperature;
  auto weight = [&](int i) { return exp(static_cast<double>(key_logit(sorted[i])) / p.temperature - scaled_first); };
  const double weight_sum = block_sum_of(n, weight, shared);
  auto prob = [&](int i) { return weight(i) / weight_sum; };

  // top-p: the smallest prefix whose cumulative probability reaches top_p (all n if rounding stays below).
  int keep = n;
  if (p.top_p < 1.0) {
    const int reached = first_crossing(n, prob, [&](double mass) { return mass >= p.top_p; }, shared);
    keep = min(reached, n - 1) + 1;
  }
  // min-p against probs[0] = exp(0) / sum, applied as a mask over the top-p prefix, as the reference does.
  const double min_prob = p.min_p * (1.0 / weight_sum);
  // A masked token's key (-inf, sorted after every allowed one) weighs 0, so no sum or crossing lands on it; it is
  // out of the fallback below too, where the reference's candidates never held it.
  auto kept = [&](int i) {
    return (p.min_p <= 0.0 || prob(i) >= min_prob) && !(p.masked && isinf(key_logit(sorted[i])));
  };
  auto kept_prob = [&](int i) { return kept(i) ? prob(i) : 0.0; };
  const double kept_sum = block_sum_of(keep, kept_prob, shared);

  // The draw: the first candidate whose renormalised cumulative probability exceeds u (searchsorted
  // side="right"); dropped candidates add nothing, so the crossing always lands on a kept one. If rounding
  // keeps every sum <= u, the last kept candidate.
  int index = first_crossing(keep, [&](int i) { return kept_prob(i) / kept_sum; },
                             [&](double mass) { return mass > p.u; }, shared);
  if (index == keep) index = last_kept(keep, kept, shared);
  if (threadIdx.x == 0) *token = key_id(sorted[index]);
}

cudaError_t sort_workspace_bytes(int vocab, std::size_t* bytes) {
  return cub::DeviceRadixSort::SortKeys(nullptr, *bytes, static_cast<const Key*>(nullptr),
                                        static_cast<Key*>(nullptr), vocab);
}

bool valid_arguments(const float* logits, int vocab, const int* seen_ids, int max_seen, const SampleParams* params,
                     const void* scratch, const int* token) {
  return logits != nullptr && vocab > 0 && vocab <= kMaxSampleVocab && max_seen >= 0 &&
         (max_seen == 0 || seen_ids != nullptr) && params != nullptr && scratch != nullptr && token != nullptr;
}

// Step 1: the keys of every logit, the seen ids' from their adjusted logits.
cudaError_t enqueue_keys(const float* logits, int vocab, const int* seen_ids, int max_seen, const SampleParams* params,
                         const SampleInputs& inputs, Key* keys, unsigned* ticket, cudaStream_t stream) {
  if (inputs.published.ready != nullptr) {  // the first reader of the mask on both paths waits behind it
    const cudaError_t waited = launch(mask_wait_kernel, 1, 1, 0, stream, params, inputs.published);
    if (waited != cudaSuccess) return waited;
  }
  const cudaError_t keyed = launch(key_kernel, (vocab + kKeyThreads - 1) / kKeyThreads, kKeyThreads, 0, stream, logits,
                                   vocab, seen_ids, max_seen, params, inputs, keys, ticket);
  if (keyed != cudaSuccess || max_seen <= 0) return keyed;
  const int blocks = std::min((max_seen + kPenaltyThreads - 1) / kPenaltyThreads, kMaxPenaltyBlocks);
  return launch(penalty_kernel, blocks, kPenaltyThreads, 0, stream, logits, vocab, seen_ids, max_seen, params, inputs,
                keys);
}

}  // namespace

cudaError_t sample_scratch_bytes(int vocab, std::size_t* bytes) {
  if (vocab <= 0 || vocab > kMaxSampleVocab || bytes == nullptr) return cudaErrorInvalidValue;
  std::size_t sort_bytes = 0;
  const cudaError_t status = sort_workspace_bytes(vocab, &sort_bytes);
  if (status != cudaSuccess) return status;
  *bytes = 2 * aligned(static_cast<std::size_t>(vocab) * sizeof(Key)) + sort_bytes;
  return cudaSuccess;
}

cudaError_t sample_token(const float* logits, int vocab, const int* seen_ids, int max_seen,
                         const SampleParams* params, const SampleInputs& inputs, void* scratch,
                         std::size_t scratch_bytes, int* token, cudaStream_t stream) {
  if (!valid_arguments(logits, vocab, seen_ids, max_seen, params, scratch, token)) return cudaErrorInvalidValue;
  std::size_t sort_bytes = 0;
  cudaError_t status = sort_workspace_bytes(vocab, &sort_bytes);
  if (status != cudaSuccess) return status;
  // Scratch layout: keys [vocab], sorted keys [vocab], the sort's workspace; each part 256-byte aligned.
  const std::size_t keys_bytes = aligned(static_cast<std::size_t>(vocab) * sizeof(Key));
  if (scratch_bytes < 2 * keys_bytes + sort_bytes) return cudaErrorInvalidValue;
  auto* base = static_cast<unsigned char*>(scratch);
  Key* keys = reinterpret_cast<Key*>(base);
  Key* sorted = reinterpret_cast<Key*>(base + keys_bytes);
  void* workspace = base + 2 * keys_bytes;
  status = enqueue_keys(logits, vocab, seen_ids, max_seen, params, inputs, keys, nullptr, stream);
  if (status != cudaSuccess) return status;
  status = cub::DeviceRadixSort::SortKeys(workspace, sort_bytes, keys, sorted, vocab, 0,
                                          static_cast<int>(8 * sizeof(Key)), stream);
  if (status != cudaSuccess) return status;
  return launch(draw_kernel, 1, kDrawThreads, 0, stream, sorted, vocab, params, token, seen_ids, max_seen,
                inputs.counts);
}

cudaError_t sample_argmax(const float* logits, int vocab, const int* seen_ids, int max_seen,
                          const SampleParams* params, const SampleInputs& inputs, void* scratch,
                          std::size_t scratch_bytes, int* token, cudaStream_t stream) {
  if (!valid_arguments(logits, vocab, seen_ids, max_seen, params, scratch, token)) return cudaErrorInvalidValue;
  // Scratch layout: keys [vocab], then where sample_token sorts them the CTAs' minima [blocks] and the ticket
  // (blocks * 8 + 4 bytes fit in the 256-byte aligned room of vocab keys).
  const std::size_t keys_bytes = aligned(static_cast<std::size_t>(vocab) * sizeof(Key));
  if (scratch_bytes < 2 * keys_bytes) return cudaErrorInvalidValue;
  const int blocks = (vocab + kMinTile - 1) / kMinTile;
  auto* base = static_cast<unsigned char*>(scratch);
  Key* keys = reinterpret_cast<Key*>(base);
  Key* partial = reinterpret_cast<Key*>(base + keys_bytes);
  auto* ticket = reinterpret_cast<unsigned*>(partial + blocks);
  const cudaError_t status = enqueue_keys(logits, vocab, seen_ids, max_seen, params, inputs, keys, ticket, stream);
  if (status != cudaSuccess) return status;
  return launch(smallest_key_kernel, blocks, kMinThreads, 0, stream, keys, vocab, partial, ticket, token, seen_ids,
                max_seen, params, inputs.counts);
}

}  // namespace strata::kernels
