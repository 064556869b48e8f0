// The arithmetic of one Gated DeltaNet token, shared by the decode step (gdn.cu) and the chunk (gdn_chunk.cu) so
// that T chunk tokens give T decode steps' results bit for bit: both call these functions, every multiply-add is
// an explicit fused or unfused intrinsic (what the compiler may contract is not left to its context), and every
// sum runs in the order fixed here.
#pragma once

#include <cuda_runtime.h>

#include "gdn.cuh"
#include "reduce.cuh"

namespace strata::kernels::gdn_token {

constexpr int kMaxConvKernel = 8;
constexpr int kHeadWarps = 8;           // a CTA's warps split the dk rows of a state column (row_slice)
constexpr int kHeadThreads = kHeadWarps * 32;
constexpr int kTileColumns = 32;        // state columns per CTA, a lane each
constexpr int kMaxRowsPerThread = 32;   // dk <= 256

// What both launchers accept (the step's limits).
inline bool shape_supported(const GdnShape& s) {
  return s.n_k_heads > 0 && s.n_v_heads > 0 && s.n_v_heads % s.n_k_heads == 0 && s.head_k_dim > 0 &&
         s.head_k_dim <= kHeadWarps * kMaxRowsPerThread && s.head_v_dim > 0 && s.conv_kernel >= 2 &&
         s.conv_kernel <= kMaxConvKernel;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ int k_head_of(const GdnShape& s, int h) {
  return s.tiled_heads ? h % s.n_k_heads : h / (s.n_v_heads / s.n_k_heads);
}

// silu of the depthwise causal conv of one channel: window[0..K-1] oldest first, weight_row[K-1] the newest tap.
__device__ __forceinline__ float conv_silu(const float* window, const float* weight_row, int kernel) {
  float acc = 0.0f;
  for (int j = 0; j < kernel; ++j) acc = __fmaf_rn(window[j], weight_row[j], acc);
  return __fmul_rn(acc, sigmoid(acc));
}

struct Gates {
  float beta, decay;  // sigmoid(b) and exp(g), g = ssm_a * softplus(a + dt_bias) <= 0
};

// v-head h's gates from one token's projections; qwen3next's ssm_ba row holds per k-head group [b x r | a x r].
__device__ __forceinline__ Gates gates_of(const GdnShape& s, const float* beta_in, const float* alpha_in,
                                          const float* ssm_a, const float* dt_bias, int h) {
  float b, a;
  if (s.interleaved_ba) {
    const int ratio = s.n_v_heads / s.n_k_heads;
    const float* ba = beta_in + (h / ratio) * 2 * ratio;  // v-head h is entry h % ratio of group h / ratio
    b = ba[h % ratio];
    a = ba[ratio + h % ratio];
  } else {
    b = beta_in[h];
    a = alpha_in[h];
  }
  return {sigmoid(b), expf(__fmul_rn(ssm_a[h], softplus(__fadd_rn(a, dt_bias[h]))))};
}

// Block-wide over kHeadThreads threads (so the sums of squares run in one order wherever it is called): one
// k-head's L2-normalised q (also scaled by 1/sqrt(dk)) and k into q_out, k_out. The caller synchronises before
// other threads read them.
__device__ __forceinline__ void normalise_qk(const float* q_in, const float* k_in, float* q_out, float* k_out,
                                             int dk) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q_sq = __fmaf_rn(q_in[i], q_in[i], q_sq);
    k_sq = __fmaf_rn(k_in[i], k_in[i], k_sq);
  }
  const float q_scale = __fmul_rn(rsqrtf(block_sum(q_sq) + 1e-6f), rsqrtf(static_cast<float>(dk)));
  const float k_scale = rsqrtf(block_sum(k_sq) + 1e-6f);
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q_out[i] = __fmul_rn(q_in[i], q_scale);
    k_out[i] = __fmul_rn(k_in[i], k_scale);
  }
}

// The rows of one state column a thread holds: warp w takes the consecutive rows [w * per_warp, (w + 1) *
// per_warp) that lie below dk, per_warp = ceil(dk / kHeadWarps). Consecutive, so a walker can read its rows' q
// and k in 16-byte loads.
struct RowSlice {
  int first, count;
};

__device__ __forceinline__ RowSlice row_slice(int warp, int dk) {
  const int per_warp = (dk + kHeadWarps - 1) / kHeadWarps;
  const int first = warp * per_warp;
  return {first, max(0, min(per_warp, dk - first))};
}

// rows[r] (r < count <= R) is row first + r; kFull says count == R, and the loops need no guard.
template <int R, bool kFull>
__device__ __forceinline__ bool holds(int r, int count) {
  return kFull || r < count;
}

// This thread's share of S[:, j]^T x over its rows in increasing order; x points at the entry of its first row.
template <int R, bool kFull>
__device__ __forceinline__ float column_dot(const float (&rows)[R], const float* x, int count) {
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (holds<R, kFull>(r, count)) sum = __fmaf_rn(rows[r], x[r], sum);
  return sum;
}

// The column's partial sums of the kHeadWarps warps ([warp][kTileColumns] in shared memory), in warp order.
__device__ __forceinline__ float sum_partials(const float* partial, int lane) {
  float sum = 0.0f;
  for (int w = 0; w < kHeadWarps; ++w) sum = __fadd_rn(sum, partial[w * kTileColumns + lane]);
  return sum;
}

// delta_j = (v_j - decay * (S^T k)_j) * beta, with kv = (S^T k)_j of the state before its decay.
__device__ __forceinline__ float delta_of(float v, float kv, const Gates& g) {
  return __fmul_rn(__fmaf_rn(-g.decay, kv, v), g.beta);
}

// S[:, j] <- decay * S[:, j] + k * delta_j on this thread's rows (k, q at the entries of its first row), each
// also stored to store[r * dv] unless store is null (the step keeps no state in registers); returns the thread's
// share of the new S[:, j]^T q.
template <int R, bool kFull>
__device__ __forceinline__ float column_update(float (&rows)[R], const float* k, const float* q, float decay,
                                               float delta, int count, float* store, int dv) {
  float out = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (holds<R, kFull>(r, count)) {
      rows[r] = __fmaf_rn(k[r], delta, __fmul_rn(decay, rows[r]));
      if (store) store[static_cast<long>(r) * dv] = rows[r];
      out = __fmaf_rn(rows[r], q[r], out);
    }
  }
  return out;
}

}  // namespace strata::kernels::gdn_token
