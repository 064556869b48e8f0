#include "logprobs.cuh"

#include <cfloat>
#include <cstddef>

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

constexpr int kMaxMaskWords = 11264;  // 44 KiB of shared memory beside the reductions: 360,448 tokens

// A token the mask does not allow is -inf: never an alternative (none beats the -FLT_MAX start), nothing in the sum.
__device__ __forceinline__ float masked_logit(const float* logits, const unsigned* mask, int i) {
  return mask == nullptr || (mask[i >> 5] >> (i & 31)) & 1u ? logits[i] : -INFINITY;
}

__global__ void __launch_bounds__(kThreads) logprobs_kernel(const float* __restrict__ logits, int vocab, int token,
                                                            int n, const unsigned* __restrict__ mask,
                                                            Logprobs* __restrict__ out) {
  await_producers();
  release_consumers();
  // The mask (possibly in mapped host memory) is read once into shared memory: the passes below read it n + 2 times.
  extern __shared__ unsigned shared_mask[];
  if (mask != nullptr) {
    for (int w = threadIdx.x; w < (vocab + 31) / 32; w += blockDim.x) shared_mask[w] = mask[w];
    __syncthreads();
    mask = shared_mask;
  }
  Best best{-FLT_MAX, 0x7fffffff};
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = masked_logit(logits, mask, i);
    if (before(v, i, best.value, best.id)) best = Best{v, i};
  }
  const Best top = block_best(best);
  double sum = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    sum += exp(static_cast<double>(masked_logit(logits, mask, i)) - top.value);
  const double log_z = static_cast<double>(top.value) + log(block_sum_double(sum));
  Best previous = top;
  for (int r = 0; r < n; ++r) {
    if (r > 0) {  // the best strictly after the previous alternative in the order
      best = Best{-FLT_MAX, 0x7fffffff};
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = masked_logit(logits, mask, i);
        if (before(previous.value, previous.id, v, i) && before(v, i, best.value, best.id)) best = Best{v, i};
      }
      previous = block_best(best);
    }
    if (threadIdx.x == 0) {
      out->ids[r] = previous.id;
      out->values[r] = static_cast<double>(previous.value) - log_z;
    }
  }
  if (threadIdx.x == 0) out->token = static_cast<double>(masked_logit(logits, mask, token)) - log_z;
}

}  // namespace

cudaError_t logprobs(const float* logits, int vocab, int token, int n, const unsigned* mask, Logprobs* out,
                     cudaStream_t stream) {
  if (logits == nullptr || out == nullptr || vocab <= 0 || token < 0 || token >= vocab || n < 0 ||
      n > kMaxLogprobs) {
    return cudaErrorInvalidValue;
  }
  const int words = (vocab + 31) / 32;
  if (mask != nullptr && words > kMaxMaskWords) return cudaErrorInvalidValue;
  const std::size_t shared = mask != nullptr ? sizeof(unsigned) * words : 0;
  return launch(logprobs_kernel, 1, kThreads, shared, stream, logits, vocab, token, n, mask, out);
}

}  // namespace strata::kernels
