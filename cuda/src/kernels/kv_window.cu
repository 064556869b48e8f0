#include <cstdint>

#include "attention_rows.cuh"
#include "kv_window.cuh"
#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kClaimThreads = 256;
constexpr int kPlanThreads = 1024;
constexpr int kCopyThreads = 256;
// The copy grid's blocks: its warps (1,024) each keep up to 4 x 16 bytes per lane in flight, ~2 MB in all, far
// above what PCIe's latency x bandwidth needs; and a grid that finds nothing to copy ends in about a microsecond.
constexpr int kCopyBlocks = 128;
constexpr int kResetThreads = 256;
constexpr int kCopyUnroll = 4;

// n words of T, src -> dst, by the 32 lanes of a warp: each lane loads kCopyUnroll words before it stores them,
// so the slow reads of mapped host memory overlap.
template <class T>
__device__ __forceinline__ void warp_copy_words(T* dst, const T* src, std::size_t n, int lane) {
  for (std::size_t base = lane; base < n; base += 32 * kCopyUnroll) {
    T word[kCopyUnroll];
#pragma unroll
    for (int k = 0; k < kCopyUnroll; ++k)
      if (base + k * 32 < n) word[k] = src[base + k * 32];
#pragma unroll
    for (int k = 0; k < kCopyUnroll; ++k)
      if (base + k * 32 < n) dst[base + k * 32] = word[k];
  }
}

// `bytes` bytes by one warp, in the widest words that both ends and the length allow (16 bytes for every
// format's codes; a scale row is 2 bytes per 32 elements, so narrow heads copy their scales in narrower words).
__device__ __forceinline__ void warp_copy(void* dst, const void* src, std::size_t bytes, int lane) {
  const std::uintptr_t both = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | bytes;
  if (both % 16 == 0)
    warp_copy_words(static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16, lane);
  else if (both % 4 == 0)
    warp_copy_words(static_cast<unsigned*>(dst), static_cast<const unsigned*>(src), bytes / 4, lane);
  else
    warp_copy_words(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes, lane);
}

// Pieces of a copy of token rows: for each half and kv head, its codes and its scales (Bf16 has none).
__device__ __forceinline__ int row_segments(const PagedKv& kv) { return 4 * kv.n_head_kv; }

// Segment `segment` (< row_segments) of rows token .. token + rows - 1, which lie in one page of `from` and of
// `to`, copied by one warp. The two caches hold the same formats.
__device__ __forceinline__ void copy_row_segment(const PagedKv& from, const PagedKv& to, int token, int rows,
                                                 int segment, int lane) {
  const bool scales = segment & 1;
  const int head = (segment >> 1) % from.n_head_kv;
  const bool value = (segment >> 1) >= from.n_head_kv;
  // Scalars picked one by one, not a KvHalf by reference: a reference chosen at run time puts the struct on the
  // stack.
  const KvCodes codes = value ? from.values.codes : from.keys.codes;
  if (scales && codes == KvCodes::Bf16) return;
  const void* src = scales ? static_cast<const void*>(value ? from.values.scale : from.keys.scale)
                           : (value ? from.values.data : from.keys.data);
  void* dst = scales ? static_cast<void*>(value ? to.values.scale : to.keys.scale)
                     : (value ? to.values.data : to.keys.data);
  const std::size_t row_bytes = scales ? kv_scale_bytes(codes, from.head_dim) : kv_code_bytes(codes, from.head_dim);
  warp_copy(static_cast<unsigned char*>(dst) + kv_row(to, token, head) * row_bytes,
            static_cast<const unsigned char*>(src) + kv_row(from, token, head) * row_bytes,
            rows * row_bytes, lane);
}

// Every segment of rows token .. token + rows - 1, over the warps of the calling block.
__device__ __forceinline__ void copy_rows_by_block(const PagedKv& from, const PagedKv& to, int token, int rows) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int segment = threadIdx.x >> 5; segment < row_segments(from); segment += warps)
    copy_row_segment(from, to, token, rows, segment, lane);
}

// Bytes of `rows` token rows of every kv head, both halves: what copying them from the host fetches.
__device__ __forceinline__ unsigned long long token_row_bytes(const PagedKv& kv, int rows) {
  const std::size_t elements = static_cast<std::size_t>(rows) * kv.n_head_kv * kv.head_dim;
  return kv_half_bytes(kv.keys.codes, elements) + kv_half_bytes(kv.values.codes, elements);
}

// Exclusive count of the set flags of the threads before this one, over the whole block (in thread order);
// *total gets the block's count. Every thread calls it; `warp_counts` is shared [32].
__device__ __forceinline__ int block_prefix_count(bool flag, int* warp_counts, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int i = 0; i < warps; ++i) {
    const int c = warp_counts[i];
    before += i < warp ? c : 0;
    all += c;
  }
  __syncthreads();  // warp_counts may be rewritten by the next call
  *total = all;
  return before + __popc(ballot & ((1u << lane) - 1u));
}

__global__ void window_reset_kernel(KvWindow w) {
  await_producers();
  release_consumers();
  const int stride = gridDim.x * blockDim.x, blocks = w.blocks();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < blocks || i < w.slots; i += stride) {
    if (i < blocks) w.slot_of[i] = -1;
    if (i < w.slots) {
      w.owner[i] = -1;
      w.stamps[i] = 0;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *w.n_copies = 0;
    *w.clock = 0;
  }
}

// One block. The evicted slot is the minimum of (stamp, slot) over all slots. Only thread 0 uses the new clock
// value (threads that read the clock after it advanced it use nothing read from it).
__global__ void __launch_bounds__(kClaimThreads) window_claim_kernel(KvWindow w, const int* position) {
  await_producers();
  release_consumers();
  __shared__ unsigned long long warp_best[kClaimThreads / 32];
  const int p = *position;
  if (p < 0 || p >= w.context()) return;
  const int block = p / w.ratio, stamp = static_cast<int>(*w.clock + 1);
  const int resident = w.slot_of[block];
  if (resident >= 0) {
    if (threadIdx.x == 0) {
      w.stamps[resident] = stamp;
      *w.clock = stamp;
    }
    return;
  }
  unsigned long long best = ~0ull;
  for (int s = threadIdx.x; s < w.slots; s += blockDim.x)
    best = min(best, static_cast<unsigned long long>(static_cast<unsigned>(w.stamps[s])) << 32 | s);
  for (int offset = 16; offset > 0; offset >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, offset));
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kClaimThreads / 32; ++i) best = min(best, warp_best[i]);
    const int slot = static_cast<int>(best & 0xffffffffu), previous = w.owner[slot];
    if (previous >= 0) w.slot_of[previous] = -1;
    w.owner[slot] = block;
    w.slot_of[block] = slot;
    w.stamps[slot] = stamp;
    *w.clock = stamp;  // every thread read the old clock before the barrier above
    *w.fetched_bytes += token_row_bytes(w.host, p - block * w.ratio);
  }
  __syncthreads();  // the slot in slot_of, for window()'s row addresses
  const int first = block * w.ratio;
  if (p > first) copy_rows_by_block(w.host, w.window(), first, p - first);
}

// One block: writes row p back and plans the fill (w.copies, slot_of, owner, stamps); window_copy_kernel then copies
// the planned blocks' rows through slot_of.
// Dynamic shared memory: 2 * slots words, the slots this token does not need and their ages.
__global__ void __launch_bounds__(kPlanThreads)
    window_plan_kernel(KvWindow w, const int* selected, const int* n_selected, const int* position) {
  await_producers();
  release_consumers();
  extern __shared__ unsigned spare[];
  __shared__ int warp_counts[32];
  const int p = *position;
  if (p < 0 || p >= w.context()) {
    if (threadIdx.x == 0) *w.n_copies = 0;
    return;
  }
  const int current = p / w.ratio, stamp = static_cast<int>(*w.clock), blocks = w.blocks();
  // (a) Row p, which attention_prep wrote into the window, back to the host (no slot: no claim, nothing written).
  const PagedKv window = w.window();
  if (w.slot_of[current] >= 0) copy_rows_by_block(window, w.host, p, 1);

  // (b) The needed blocks: stamp the resident ones, list the missing ones in w.copies. Selected blocks are
  // complete blocks (< (p + 1) / ratio), so the current block can only be the last of them.
  const int n = min(max(*n_selected, 0), w.keep_blocks);
  const int needed = n + (n > 0 && selected[n - 1] == current ? 0 : 1);
  int missing = 0;
  for (int base = 0; base < needed; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const int block = i >= needed ? -1 : i < n ? selected[i] : current;
    bool miss = false;
    if (block >= 0 && block < blocks) {
      const int slot = w.slot_of[block];
      if (slot >= 0) w.stamps[slot] = stamp;
      miss = slot < 0;
    }
    int total = 0;
    const int at = missing + block_prefix_count(miss, warp_counts, &total);
    if (miss) w.copies[at] = block;
    missing += total;
  }
  if (missing == 0) {
    if (threadIdx.x == 0) *w.n_copies = 0;
    return;
  }
  // (c) The slots this token does not need (the stamps above are visible: block_prefix_count synchronised).
  unsigned* spare_slot = spare;
  unsigned* spare_age = spare + w.slots;
  int n_spare = 0;
  for (int base = 0; base < w.slots; base += blockDim.x) {
    const int s = base + threadIdx.x;
    const int slot_stamp = s < w.slots ? w.stamps[s] : stamp;
    const bool free_slot = slot_stamp != stamp;
    int total = 0;
    const int at = n_spare + block_prefix_count(free_slot, warp_counts, &total);
    if (free_slot) {
      spare_slot[at] = s;
      spare_age[at] = static_cast<unsigned>(slot_stamp);
    }
    n_spare += total;
  }
  __syncthreads();
  // (d) Missing block k goes to the spare slot of rank k in (age, slot) order; spare_slot is in slot order.
  const int copies = min(missing, n_spare);
  for (int e = threadIdx.x; e < n_spare; e += blockDim.x) {
    const unsigned age = spare_age[e];
    int rank = 0;
    for (int j = 0; j < n_spare; ++j) rank += spare_age[j] < age || (spare_age[j] == age && j < e);
    if (rank >= copies) continue;
    const int slot = static_cast<int>(spare_slot[e]), block = w.copies[rank], previous = w.owner[slot];
    if (previous >= 0) w.slot_of[previous] = -1;  // not needed by this token, so never one of the missing
    w.slot_of[block] = slot;
    w.owner[slot] = block;
    w.stamps[slot] = stamp;
  }
  if (threadIdx.x == 0) {
    *w.n_copies = copies;
    *w.fetched_bytes += copies * token_row_bytes(w.host, w.ratio);
  }
}

// The planned blocks' rows, host -> window: one warp per segment (half, kv head, codes or scales) of a block. The
// grid is fixed (graphs replay it) and most of it finds nothing to do.
__global__ void __launch_bounds__(kCopyThreads) window_copy_kernel(KvWindow w) {
  await_producers();
  release_consumers();
  const int copies = *w.n_copies;
  const PagedKv window = w.window();
  const int per_block = row_segments(w.host), lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  for (int job = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); job < copies * per_block; job += warps) {
    const int block = w.copies[job / per_block];
    copy_row_segment(w.host, window, block * w.ratio, w.ratio, job % per_block, lane);
  }
}

bool valid_window(const KvWindow& w) {
  const PagedKv& h = w.host;
  return h.n_head_kv > 0 && h.head_dim > 0 && h.head_dim % kKvGroup == 0 && h.max_pages > 0 &&
         h.page_table != nullptr && valid_kv_half(h.keys) && valid_kv_half(h.values) && w.ratio > 0 &&
         h.page_size > 0 && h.page_size % w.ratio == 0 &&
         static_cast<long>(h.max_pages) * h.page_size <= 0x7fffffff &&
         w.slots > 0 && w.slots <= kMaxWindowSlots && w.keep_blocks >= 0 && valid_kv_half(w.keys) &&
         valid_kv_half(w.values) && w.keys.codes == h.keys.codes && w.values.codes == h.values.codes &&
         w.slot_of != nullptr && w.owner != nullptr && w.stamps != nullptr && w.clock != nullptr &&
         w.copies != nullptr &&
         w.n_copies != nullptr && w.fetched_bytes != nullptr;
}

}  // namespace

cudaError_t kv_window_reset(const KvWindow& w, cudaStream_t stream) {
  if (!valid_window(w)) return cudaErrorInvalidValue;
  const int items = max(w.blocks(), w.slots);
  const int grid = min((items + kResetThreads - 1) / kResetThreads, 1024);
  return launch(window_reset_kernel, grid, kResetThreads, 0, stream, w);
}

cudaError_t kv_window_claim(const KvWindow& w, const int* position, cudaStream_t stream) {
  if (!valid_window(w) || position == nullptr) return cudaErrorInvalidValue;
  return launch(window_claim_kernel, 1, kClaimThreads, 0, stream, w, position);
}

cudaError_t kv_window_fill(const KvWindow& w, const int* selected_blocks, const int* n_selected, const int* position,
                           cudaStream_t stream) {
  if (!valid_window(w) || w.slots < w.keep_blocks + 2 || selected_blocks == nullptr || n_selected == nullptr ||
      position == nullptr)
    return cudaErrorInvalidValue;
  const cudaError_t planned = launch(window_plan_kernel, 1, kPlanThreads, 2 * sizeof(int) * w.slots, stream, w,
                                     selected_blocks, n_selected, position);
  if (planned != cudaSuccess) return planned;
  return launch(window_copy_kernel, kCopyBlocks, kCopyThreads, 0, stream, w);
}

}  // namespace strata::kernels
