// The elementwise pieces of qwen4exp's hyper-connection mixer (docs/models/qwen4exp.md §3(a)); the
// grouped RMSNorm is norm.cuh's rms_norm_grouped and the projections are gemv.cuh's. Each runs over `rows`
// tokens in one launch (decode passes rows = 1, a prompt chunk its T tokens), one contiguous row per token.
// Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

enum class Activation : int { Sigmoid = 0, Silu = 1 };

// out[i] = post * act(pre * in[i]) for i < n. The mixer's low-rank activation lo = silu(down / 4) is
// (Silu, 1/4, 1); its injection weights inj = 2 * sigmoid(inject / 4) are (Sigmoid, 1/4, 2). out may alias in.
cudaError_t scaled_activation(const float* in, float* out, int n, Activation act, float pre, float post,
                              cudaStream_t stream);

// The block input x[r][i] = (1/streams) Σ_k sigmoid(up[r][k][i]) * normed[r][k][i] for r < rows, i < n: the
// sigmoid of the up projection gates each normalised stream, then the streams are averaged. up, normed
// [rows][streams][n], x [rows][n].
cudaError_t hc_mix(const float* up, const float* normed, float* x, int rows, int streams, int n,
                   cudaStream_t stream);

// A vector added to every stream of a row right after a write (a control vector: docs/control_vectors.md): the
// same `vector` [n] for every row, or, for a step whose rows are several sequences', each row's own through
// `rows`, a table in device memory [rows] of each row's vectors (null: nothing added to that row), its vector
// `offset` floats in (the layer's row of the sequence's [n_layer][n] table). Neither: nothing is added.
struct StreamAddend {
  const float* vector = nullptr;
  const float* const* rows = nullptr;
  long offset = 0;
  __host__ __device__ bool empty() const { return vector == nullptr && rows == nullptr; }
};

// The write-back h[r][k][i] += inj[r * inj_stride + k] * y[r][i] for every stream k < streams (onto the raw
// streams): h [rows][streams][n], y [rows][n]. inj_stride 0 gives every row the same inj [streams] (the
// embedding's and the PLE addend's unit weights); a block's injection weights are [rows][streams], stride streams.
// With an `add`, each element is then (h + inj * y) + a, its row's addend a, in that order (the reference's);
// an addend of zero leaves the element's bits. An empty `add` runs the plain write, bit for bit as without it.
cudaError_t hc_write(float* h, const float* inj, int inj_stride, const float* y, int rows, int streams, int n,
                     cudaStream_t stream, StreamAddend add = {});

// out[i] = (1/streams) sum_k h[k][i] for i < n (summed in float64): one row's streams h [streams][n] as one vector,
// what `strata cvector` measures a layer's output by (docs/control_vectors.md). out may be mapped host memory.
cudaError_t hc_stream_mean(const float* h, int streams, int n, float* out, cudaStream_t stream);

}  // namespace strata::kernels
