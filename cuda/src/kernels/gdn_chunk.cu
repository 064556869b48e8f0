#include <cuda_pipeline.h>

#include "gdn_chunk.cuh"
#include "gdn_token.cuh"
#include "launch.cuh"
#include "norm.cuh"

namespace strata::kernels {
namespace {

using namespace gdn_token;

constexpr int kConvThreads = 256;
// The walk's ring of per-token inputs in shared memory: kAhead tokens are in flight while one is computed, and
// a slot is refilled only when no thread can still read it (the token before the current one may still be read
// by a slower thread, the current one by every thread): kSlots >= kAhead + 2.
constexpr int kAhead = 6;
constexpr int kSlots = 8;
static_assert(kSlots >= kAhead + 2, "a slot would be refilled while still being read");

// Where a token's row starts.
template <class Float>
__device__ __forceinline__ Float* row_of(Float* base, int t, int stride) {
  return base + static_cast<long>(t) * stride;
}

// Scratch layout: [T][Hk][q dk | k dk], then the gates [T][Hv] (beta, decay).
struct Scratch {
  float* qk;
  float* gates;
};

__host__ __device__ __forceinline__ Scratch carve(const GdnShape& s, float* scratch, int tokens) {
  return {scratch, scratch + static_cast<long>(tokens) * s.n_k_heads * 2 * s.head_k_dim};
}

// A walk slot: q, k, beta and decay, the tile's v, rounded up to whole 16-byte units so every slot is aligned.
__host__ __device__ __forceinline__ int slot_floats(int dk) { return (2 * dk + 2 + kTileColumns + 3) / 4 * 4; }

// In the full walk (dk = 8 R, R a multiple of 4) a thread's R rows of q or k start 16-byte aligned in their
// slot, and R / 4 float4 loads into registers do what R float loads would (shared memory's issue rate bounds the
// walk as much as its arithmetic does). The guarded walk reads the slot itself.
template <int R, bool kFull>
__device__ __forceinline__ const float* rows_of(const float* first, float (&registers)[R]) {
  static_assert(!kFull || R % 4 == 0, "full rows come in float4s");
  if constexpr (kFull) {
#pragma unroll
    for (int r = 0; r < R; r += 4) {
      const float4 four = *reinterpret_cast<const float4*>(first + r);
      registers[r] = four.x;
      registers[r + 1] = four.y;
      registers[r + 2] = four.z;
      registers[r + 3] = four.w;
    }
    return registers;
  } else {
    return first;
  }
}

// Channel c of token t: the same conv as the step's, its window reaching back through its span's own raw rows
// and, for the span's first K-1 tokens, into the history the span's sequence started with.
__global__ void gdn_chunk_conv_kernel(GdnShape shape, GdnChunkArgs args) {
  await_producers();
  release_consumers();
  const int channels = shape.conv_channels(), kernel = shape.conv_kernel;
  const int t = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const StateSpan span = row_span(args.spans, t, args.tokens);
  const float* history = in_arena(args.conv_state, span.state);
  float window[kMaxConvKernel];
  for (int j = 0; j < kernel; ++j) {
    const int source = t - span.first - (kernel - 1) + j;  // within the span
    window[j] = source >= 0 ? row_of(args.qkv, span.first + source, args.qkv_stride)[c]
                            : history[static_cast<long>(kernel - 1 + source) * channels + c];
  }
  row_of(args.conv_out, t, args.conv_out_stride)[c] = conv_silu(window, args.conv_weight + c * kernel, kernel);
}

// History row j after a span's first `tokens` tokens: the raw row `tokens` later in [old history | the span's
// raw rows], read before anything is written over the old history.
__device__ __forceinline__ float history_entry(const GdnShape& shape, const GdnChunkArgs& args, const StateSpan& span,
                                               const float* history, int tokens, int j, int c) {
  const int source = tokens - (shape.conv_kernel - 1) + j;
  return source >= 0 ? row_of(args.qkv, span.first + source, args.qkv_stride)[c]
                     : history[static_cast<long>(shape.conv_kernel - 1 + source) * shape.conv_channels() + c];
}

// The history each span leaves behind (a block row per span): the last K-1 raw rows, older history rows where
// the span is shorter than that (and, with row states, the history after each token first). Runs after the conv
// read the old history. Rising j is safe in place: row j takes old row T + j, never yet written.
__global__ void gdn_chunk_history_kernel(GdnShape shape, GdnChunkArgs args) {
  await_producers();
  release_consumers();
  const int channels = shape.conv_channels(), kernel = shape.conv_kernel;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const StateSpan span = step_span(args.spans, blockIdx.y, args.tokens);
  float* history = in_arena(args.conv_state, span.state);
  if (float* rows = kept_rows(args.conv_rows, args.spans, span))
    for (int t = 0; t < span.count; ++t)
      for (int j = 0; j < kernel - 1; ++j)
        rows[t * args.row_stride + static_cast<long>(j) * channels + c] =
            history_entry(shape, args, span, history, t + 1, j, c);
  for (int j = 0; j < kernel - 1; ++j)
    history[static_cast<long>(j) * channels + c] = history_entry(shape, args, span, history, span.count, j, c);
}

// One CTA per (token, k-head), with the step's block size so the sums of squares match: the normalised q and k,
// and the gates of v-heads kh * r .. kh * r + r - 1 (a split of the v-heads over the CTAs, whatever the map).
__global__ void __launch_bounds__(kHeadThreads) gdn_chunk_prep_kernel(GdnShape shape, GdnChunkArgs args) {
  await_producers();
  release_consumers();
  const int t = blockIdx.x, kh = blockIdx.y;
  const int dk = shape.head_k_dim, hk = shape.n_k_heads, ratio = shape.n_v_heads / hk;
  const Scratch scratch = carve(shape, args.scratch, args.tokens);
  const float* conv = row_of(args.conv_out, t, args.conv_out_stride);
  float* qk = scratch.qk + (static_cast<long>(t) * hk + kh) * 2 * dk;
  normalise_qk(conv + kh * dk, conv + hk * dk + kh * dk, qk, qk + dk, dk);
  const float* beta_in = row_of(args.beta_in, t, args.beta_stride);
  const float* alpha_in = shape.interleaved_ba ? nullptr : row_of(args.alpha_in, t, args.alpha_stride);
  for (int m = threadIdx.x; m < ratio; m += blockDim.x) {
    const int h = kh * ratio + m;
    const Gates g = gates_of(shape, beta_in, alpha_in, args.ssm_a, args.dt_bias, h);
    float* dst = scratch.gates + (static_cast<long>(t) * shape.n_v_heads + h) * 2;
    dst[0] = g.beta;
    dst[1] = g.decay;
  }
}

// The recurrence, sequential in tokens but independent per state column: a CTA owns one v-head's tile of 32
// columns as the step's CTA does (a lane per column, the warps splitting the dk rows), keeps its part of the
// state in registers and walks all T tokens. Per token one barrier: the kv partial sums meet in shared memory
// (double-buffered, so the next token's writes cannot overtake this token's reads), and the out partials of
// token t are summed after the barrier of token t + 1, off the path to the next token. Each token's q, k, gates
// and v tile arrive by cp.async kAhead tokens early, in a ring of kSlots slots.
template <int R, bool kFull>
__global__ void __launch_bounds__(kHeadThreads) gdn_chunk_walk_kernel(GdnShape shape, GdnChunkArgs args) {
  await_producers();
  release_consumers();
  extern __shared__ __align__(16) float shared[];
  const StateSpan span = step_span(args.spans, blockIdx.z, args.tokens);
  const int dk = shape.head_k_dim, dv = shape.head_v_dim, hk = shape.n_k_heads, tokens = span.count;
  const int first_token = span.first;  // the span's rows in the step's buffers and scratch
  const int h = blockIdx.x, kh = k_head_of(shape, h);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first_column = blockIdx.y * kTileColumns, j = first_column + lane;
  const int tile_columns = min(kTileColumns, dv - first_column);
  const bool column = j < dv;
  const RowSlice mine = row_slice(warp, dk);
  const int slot_size = slot_floats(dk), slot_inputs = 2 * dk + 2 + tile_columns;
  float* slots = shared;                                 // [kSlots][slot_size]
  float* kv_partial = slots + kSlots * slot_size;        // [2][kHeadWarps][kTileColumns]
  float* out_partial = kv_partial + 2 * kHeadThreads;    // [2][kHeadWarps][kTileColumns]
  const Scratch scratch = carve(shape, args.scratch, args.tokens);

  // The copies this thread issues for each token, in order of tokens: slot element element[n] from source[n],
  // which then steps one token on. Set up once, so a token's fetch costs a few instructions.
  constexpr int kMaxCopies = (2 * kHeadWarps * kMaxRowsPerThread + 2 + kTileColumns + kHeadThreads - 1) / kHeadThreads;
  int element[kMaxCopies];
  const float* source[kMaxCopies];
  long stride[kMaxCopies];
#pragma unroll
  for (int n = 0; n < kMaxCopies; ++n) {
    const int e = threadIdx.x + n * kHeadThreads;
    element[n] = e;
    if (e < 2 * dk) {
      stride[n] = static_cast<long>(hk) * 2 * dk;
      source[n] = scratch.qk + first_token * stride[n] + kh * 2 * dk + e;
    } else if (e < 2 * dk + 2) {
      stride[n] = 2 * shape.n_v_heads;
      source[n] = scratch.gates + first_token * stride[n] + h * 2 + (e - 2 * dk);
    } else {
      stride[n] = args.conv_out_stride;
      source[n] = args.conv_out + first_token * stride[n] + 2 * hk * dk + h * dv + first_column + (e - 2 * dk - 2);
    }
  }
  const auto fetch = [&](int t) {
    if (t < tokens) {
      float* slot = slots + (t % kSlots) * slot_size;
#pragma unroll
      for (int n = 0; n < kMaxCopies; ++n) {
        if (element[n] < slot_inputs) __pipeline_memcpy_async(slot + element[n], source[n], sizeof(float));
        source[n] += stride[n];
      }
    }
    __pipeline_commit();  // one group per token, empty past the end, so the wait counts stay uniform
  };

  const long first_entry = (static_cast<long>(h) * dk + mine.first) * dv + j;  // this thread's first row's
  float* s = in_arena(args.state, span.state) + first_entry;
  float* const state_rows = kept_rows(args.state_rows, args.spans, span);
  float rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = column && holds<R, kFull>(r, mine.count) ? s[static_cast<long>(r) * dv] : 0.0f;
  for (int t = 0; t < kAhead; ++t) fetch(t);
  __pipeline_wait_prior(kAhead - 1);  // token 0 has landed
  __syncthreads();

  for (int t = 0; t < tokens; ++t) {
    fetch(t + kAhead);
    const float* slot = slots + (t % kSlots) * slot_size;
    float q_rows[R], k_rows[R];
    const float* k = rows_of<R, kFull>(slot + dk + mine.first, k_rows);
    const Gates gates{slot[2 * dk], slot[2 * dk + 1]};
    const float v = column ? slot[2 * dk + 2 + lane] : 0.0f;
    float* kv = kv_partial + (t & 1) * kHeadThreads;
    kv[warp * kTileColumns + lane] = column_dot<R, kFull>(rows, k, mine.count);
    __pipeline_wait_prior(kAhead - 1);  // token t + 1 has landed: the barrier publishes it for the next round
    __syncthreads();
    if (t > 0 && warp == (t - 1) % kHeadWarps && column)
      row_of(args.out, first_token + t - 1, args.out_stride)[h * dv + j] =
          sum_partials(out_partial + ((t - 1) & 1) * kHeadThreads, lane);
    const float delta = delta_of(v, sum_partials(kv, lane), gates);
    const float* q = rows_of<R, kFull>(slot + mine.first, q_rows);
    out_partial[(t & 1) * kHeadThreads + warp * kTileColumns + lane] =
        column_update<R, kFull>(rows, k, q, gates.decay, delta, mine.count, nullptr, dv);
    if (state_rows && column) {
      float* row_state = state_rows + t * args.row_stride + first_entry;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (holds<R, kFull>(r, mine.count)) row_state[static_cast<long>(r) * dv] = rows[r];
    }
  }
  __syncthreads();
  const int last = tokens - 1;
  if (warp == last % kHeadWarps && column)
    row_of(args.out, first_token + last, args.out_stride)[h * dv + j] =
        sum_partials(out_partial + (last & 1) * kHeadThreads, lane);
  if (!column) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (holds<R, kFull>(r, mine.count)) s[static_cast<long>(r) * dv] = rows[r];
}

template <int R, bool kFull>
cudaError_t launch_walk(const GdnShape& shape, const GdnChunkArgs& args, cudaStream_t stream) {
  const std::size_t smem = (kSlots * slot_floats(shape.head_k_dim) + 4 * kHeadThreads) * sizeof(float);
  const dim3 grid(shape.n_v_heads, (shape.head_v_dim + kTileColumns - 1) / kTileColumns, span_extent(args.spans));
  return launch(gdn_chunk_walk_kernel<R, kFull>, grid, kHeadThreads, smem, stream, shape, args);
}

// The walk with exactly the rows dk needs where it is a whole multiple of kHeadWarps (every real model: no row
// guards in the loop), else the step's guarded 32.
cudaError_t walk(const GdnShape& shape, const GdnChunkArgs& args, cudaStream_t stream) {
  switch (shape.head_k_dim) {
    case 8 * kHeadWarps: return launch_walk<8, true>(shape, args, stream);
    case 16 * kHeadWarps: return launch_walk<16, true>(shape, args, stream);
    case 32 * kHeadWarps: return launch_walk<32, true>(shape, args, stream);
    default: return launch_walk<kMaxRowsPerThread, false>(shape, args, stream);
  }
}

bool strides_fit(const GdnShape& shape, const GdnChunkArgs& a) {
  const int channels = shape.conv_channels(), values = shape.n_v_heads * shape.head_v_dim;
  const int beta_width = shape.interleaved_ba ? 2 * shape.n_v_heads : shape.n_v_heads;
  const long state = static_cast<long>(shape.n_v_heads) * shape.head_k_dim * shape.head_v_dim;
  const long history = static_cast<long>(shape.conv_kernel - 1) * channels;
  const bool rows_fit = (!a.state_rows || a.row_stride >= state) && (!a.conv_rows || a.row_stride >= history);
  return a.qkv_stride >= channels && a.z_stride >= values && a.beta_stride >= beta_width &&
         (shape.interleaved_ba || a.alpha_stride >= shape.n_v_heads) && a.conv_out_stride >= channels &&
         a.out_stride >= values && rows_fit;
}

}  // namespace

std::size_t gdn_chunk_scratch_floats(const GdnShape& shape, int tokens) {
  const std::size_t per_token = 2 * static_cast<std::size_t>(shape.n_k_heads) * shape.head_k_dim + 2 * shape.n_v_heads;
  return tokens > 0 ? per_token * tokens : 0;
}

cudaError_t gdn_chunk(const GdnShape& shape, const GdnChunkArgs& args, cudaStream_t stream) {
  if (!shape_supported(shape) || args.tokens < 1 || !args.scratch || !strides_fit(shape, args) ||
      !valid_spans(args.spans))
    return cudaErrorInvalidValue;
  const int channels = shape.conv_channels(), channel_blocks = (channels + kConvThreads - 1) / kConvThreads;
  cudaError_t status = launch(gdn_chunk_conv_kernel, dim3(args.tokens, channel_blocks), kConvThreads, 0, stream, shape,
                              args);
  if (status == cudaSuccess)
    status = launch(gdn_chunk_history_kernel, dim3(channel_blocks, span_extent(args.spans)), kConvThreads, 0, stream,
                    shape, args);
  if (status == cudaSuccess)
    status = launch(gdn_chunk_prep_kernel, dim3(args.tokens, shape.n_k_heads), kHeadThreads, 0, stream, shape, args);
  if (status != cudaSuccess) return status;
  if (const cudaError_t status = walk(shape, args, stream); status != cudaSuccess) return status;
  return rms_norm_gated_rows(args.out, args.out_stride, args.z, args.z_stride, args.norm_weight, args.out,
                             args.tokens, shape.n_v_heads, shape.head_v_dim, shape.eps,
                             shape.sigmoid_gate ? Gate::Sigmoid : Gate::Silu, stream);
}

}  // namespace strata::kernels
