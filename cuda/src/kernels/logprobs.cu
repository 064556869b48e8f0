#include "logprobs.cuh"

#include <cfloat>

#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 1024;

// The order of the alternatives: larger value first, then the lower id.
__device__ __forceinline__ bool before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

struct Best {
  float value;
  int id;
};

__device__ Best block_best(Best mine) {
  __shared__ Best partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, mine.value, offset), __shfl_xor_sync(0xffffffffu, mine.id, offset)};
    if (before(other.value, other.id, mine.value, mine.id)) mine = other;
  }
  __syncthreads();
  if (lane == 0) partial[warp] = mine;
  __syncthreads();
  mine = lane < (blockDim.x >> 5) ? partial[lane] : Best{-FLT_MAX, 0x7fffffff};
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, mine.value, offset), __shfl_xor_sync(0xffffffffu, mine.id, offset)};
    if (before(other.value, other.id, mine.value, mine.id)) mine = other;
  }
  return mine;
}

__device__ double block_sum_double(double v) {
  __shared__ double partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? partial[lane] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void __launch_bounds__(kThreads) logprobs_kernel(const float* __restrict__ logits, int vocab, int token,
                                                            int n, Logprobs* __restrict__ out) {
  await_producers();
  release_consumers();
  Best best{-FLT_MAX, 0x7fffffff};
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (before(logits[i], i, best.value, best.id)) best = Best{logits[i], i};
  const Best top = block_best(best);
  double sum = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += exp(static_cast<double>(logits[i]) - top.value);
  const double log_z = static_cast<double>(top.value) + log(block_sum_double(sum));
  Best previous = top;
  for (int r = 0; r < n; ++r) {
    if (r > 0) {  // the best strictly after the previous alternative in the order
      best = Best{-FLT_MAX, 0x7fffffff};
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = logits[i];
        if (before(previous.value, previous.id, v, i) && before(v, i, best.value, best.id)) best = Best{v, i};
      }
      previous = block_best(best);
    }
    if (threadIdx.x == 0) {
      out->ids[r] = previous.id;
      out->values[r] = static_cast<double>(previous.value) - log_z;
    }
  }
  if (threadIdx.x == 0) out->token = static_cast<double>(logits[token]) - log_z;
}

}  // namespace

cudaError_t logprobs(const float* logits, int vocab, int token, int n, Logprobs* out, cudaStream_t stream) {
  if (logits == nullptr || out == nullptr || vocab <= 0 || token < 0 || token >= vocab || n < 0 ||
      n > kMaxLogprobs) {
    return cudaErrorInvalidValue;
  }
  return launch(logprobs_kernel, 1, kThreads, 0, stream, logits, vocab, token, n, out);
}

}  // namespace strata::kernels
