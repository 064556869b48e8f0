#include "launch.cuh"
#include "ple.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kPleThreads = 256;
constexpr int kMaxConvKernel = 8;
constexpr long kMaxBlocks = 0x7fffffff;  // CUDA's limit on gridDim.x

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One token's gate for one stream and the conv norm's 1 / rms of its gated row.
struct StreamGate {
  float gate = 0.0f;
  float inv_rms = 0.0f;
};

// The key/query norms and gate of stream h (its channels from `base`) for the token whose rows args' streams,
// key and value address. Every thread of the block calls it (block sums), and every thread gets the result.
__device__ StreamGate stream_gate(const PleShape& shape, const PleStepArgs& args, long base) {
  const int n = shape.width;
  float kk = 0.0f, qq = 0.0f, kq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float k = args.key[base + i], q = args.streams[base + i];
    kk += k * k;
    qq += q * q;
    kq += (k * args.norm_key[base + i]) * (q * args.norm_query[base + i]);
  }
  kk = block_sum(kk);
  qq = block_sum(qq);
  kq = block_sum(kq);
  const float inv_k = rsqrtf(kk / n + shape.eps), inv_q = rsqrtf(qq / n + shape.eps);
  const float score = kq * inv_k * inv_q * rsqrtf(static_cast<float>(n));
  StreamGate g;
  g.gate = sigmoid(copysignf(sqrtf(fmaxf(fabsf(score), 1e-6f)), score));
  float gg = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float gated = g.gate * args.value[i];
    gg += gated * gated;
  }
  g.inv_rms = rsqrtf(block_sum(gg) / n + shape.eps);
  return g;
}

// The normed gated row's entry for channel c (column i of the value), the conv's input and history row.
__device__ __forceinline__ float normed_entry(const StreamGate& g, float gated, const PleStepArgs& args, long c) {
  return gated * g.inv_rms * args.norm_conv[c];
}

// The conv of channel c before its silu: this token's normed entry times the last tap, plus tap j times the
// normed entry of the token dilation * (K-1-j) back, which past(back) returns.
template <class Past>
__device__ __forceinline__ float conv_sum(const PleShape& shape, const PleStepArgs& args, long c, float normed,
                                          Past past) {
  const int k_taps = shape.conv_kernel;
  float acc = normed * args.conv_weight[c * k_taps + k_taps - 1];
  for (int j = 0; j < k_taps - 1; ++j)
    acc += past(shape.dilation * (k_taps - 1 - j)) * args.conv_weight[c * k_taps + j];
  return acc;
}

__device__ __forceinline__ float addend(float gated, float acc) { return gated + acc * sigmoid(acc); }

// args with its per-token pointers moved to token t's rows.
__device__ __forceinline__ PleStepArgs token_args(const PleShape& shape, PleStepArgs args, int t) {
  const long channels = static_cast<long>(shape.streams) * shape.width;
  args.streams += t * channels;
  args.key += t * channels;
  args.value += static_cast<long>(t) * shape.width;
  args.out += t * channels;
  return args;
}

// One block per stream h: its key/query norms and gate, then for each of its n channels the normed gated
// value, the dilated conv over the history and the history shift (each channel owned by one thread).
__global__ void ple_step_kernel(PleShape shape, PleStepArgs args) {
  await_producers();
  release_consumers();
  const int n = shape.width, h = blockIdx.x, rows = shape.history_rows();
  const long base = static_cast<long>(h) * n;
  const StreamGate g = stream_gate(shape, args, base);
  const long channels = static_cast<long>(shape.streams) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const long c = base + i;
    const float gated = g.gate * args.value[i];
    const float normed = normed_entry(g, gated, args, c);
    const float acc =
        conv_sum(shape, args, c, normed, [&](int back) { return args.history[(rows - back) * channels + c]; });
    for (int r = 0; r + 1 < rows; ++r) args.history[r * channels + c] = args.history[(r + 1) * channels + c];
    args.history[(rows - 1) * channels + c] = normed;
    args.out[c] = addend(gated, acc);
  }
}

// One block per (token t, stream h), h fastest so that the blocks of neighbouring tokens, which read each
// other's rows, run together. A tap reaching before the token's span reads the history as the span found it; one
// inside it recomputes that token's gate (the same code, so the same bits as ple_step's) instead of waiting on
// another block. The history is left alone: ple_history_kernel advances it after every block has read it.
__global__ void ple_chunk_kernel(PleShape shape, PleStepArgs args, int tokens, StepSpans spans) {
  await_producers();
  release_consumers();
  const int n = shape.width, h = blockIdx.x % shape.streams, t = blockIdx.x / shape.streams;
  const int rows = shape.history_rows();
  const long base = static_cast<long>(h) * n, channels = static_cast<long>(shape.streams) * n;
  const StateSpan span = row_span(spans, t, tokens);
  const float* history = in_arena(args.history, span.state);
  const int local = t - span.first;  // the token's place in its span
  const PleStepArgs own = token_args(shape, args, t);
  const StreamGate g = stream_gate(shape, own, base);
  StreamGate earlier[kMaxConvKernel - 1];  // earlier[m - 1]: the token dilation * m back, when in the span
  for (int m = 1; m < shape.conv_kernel; ++m) {
    const int from = local - shape.dilation * m;
    if (from >= 0) earlier[m - 1] = stream_gate(shape, token_args(shape, args, span.first + from), base);
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const long c = base + i;
    const float gated = g.gate * own.value[i];
    const float acc = conv_sum(shape, args, c, normed_entry(g, gated, args, c), [&](int back) {
      const int from = local - back;
      if (from < 0) return history[(rows + from) * channels + c];
      const StreamGate& past = earlier[back / shape.dilation - 1];
      return normed_entry(past, past.gate * args.value[static_cast<long>(span.first + from) * n + i], args, c);
    });
    own.out[c] = addend(gated, acc);
  }
}

// History row r after the first `after` tokens of `span`, written at `dst` (each channel owned by one thread):
// the row `after` later in [old history | the span's normed rows], in ascending r, so that in place an old row
// is read before it is overwritten.
__device__ void advance_history(const PleShape& shape, const PleStepArgs& args, const StateSpan& span,
                                const float* history, int after, float* dst) {
  const int n = shape.width, rows = shape.history_rows();
  const long base = static_cast<long>(blockIdx.x) * n, channels = static_cast<long>(shape.streams) * n;
  for (int r = 0; r < rows; ++r) {
    const int from = after + r - rows;  // the span's token whose normed row lands in row r, when >= 0
    if (from < 0) {
      for (int i = threadIdx.x; i < n; i += blockDim.x)
        dst[r * channels + base + i] = history[(r + after) * channels + base + i];
      continue;
    }
    const PleStepArgs at = token_args(shape, args, span.first + from);
    const StreamGate g = stream_gate(shape, at, base);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      dst[r * channels + base + i] = normed_entry(g, g.gate * at.value[i], args, base + i);
  }
}

// One block per (stream, span): the span's history after each of its tokens into its row states (where it keeps
// them), then its history advanced in place.
__global__ void ple_history_kernel(PleShape shape, PleStepArgs args, int tokens, StepSpans spans) {
  await_producers();
  release_consumers();
  const StateSpan span = step_span(spans, blockIdx.y, tokens);
  float* history = in_arena(args.history, span.state);
  if (float* kept = kept_rows(args.history_rows, spans, span))
    for (int t = 0; t < span.count; ++t) advance_history(shape, args, span, history, t + 1, kept + t * args.row_stride);
  advance_history(shape, args, span, history, span.count, history);
}

bool valid(const PleShape& shape) {
  return shape.streams > 0 && shape.width > 0 && shape.dilation > 0 && shape.conv_kernel >= 2 &&
         shape.conv_kernel <= kMaxConvKernel;
}

}  // namespace

cudaError_t ple_step(const PleShape& shape, const PleStepArgs& args, cudaStream_t stream) {
  if (!valid(shape)) return cudaErrorInvalidValue;
  return launch(ple_step_kernel, shape.streams, kPleThreads, 0, stream, shape, args);
}

cudaError_t ple_chunk(const PleShape& shape, const PleStepArgs& args, int tokens, cudaStream_t stream,
                      const StepSpans& spans) {
  const long history_floats = static_cast<long>(shape.history_rows()) * shape.streams * shape.width;
  const bool rows = args.history_rows || spans.n > 0;  // with spans a null row offset is a slot's start
  if (!valid(shape) || tokens <= 0 || static_cast<long>(shape.streams) * tokens > kMaxBlocks ||
      (rows && args.row_stride < history_floats) || !valid_spans(spans))
    return cudaErrorInvalidValue;
  const cudaError_t launched =
      launch(ple_chunk_kernel, shape.streams * tokens, kPleThreads, 0, stream, shape, args, tokens, spans);
  if (launched != cudaSuccess) return launched;
  return launch(ple_history_kernel, dim3(shape.streams, span_extent(spans)), kPleThreads, 0, stream, shape, args,
                tokens, spans);
}

}  // namespace strata::kernels
