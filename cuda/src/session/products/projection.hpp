// y = W x for the decode program: one q8_32 quantization of x shared by every quantized weight that reads
// it, then the GEMV for each weight's form, the products as parallel branches where side streams are given
// (in a captured graph they become parallel nodes: small projections hide behind the large one).
// project() enqueues only (no allocation, no synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "../../kernels/gemv.cuh"
#include "../../kernels/matmul.cuh"
#include "../../kernels/router_publish.cuh"
#include "../../kernels/quantize.cuh"
#include "strata/device_weights.hpp"
#include "strata/error.hpp"

namespace strata {

// `t` as the kernels that run a GEMV's row dots in their own launch take it.
inline kernels::WeightMatrix weight_matrix(const DeviceTensor& t) {
  return {t.is_float, t.float_kind, t.data, t.form, t.planes};
}

// One weight and where its output goes.
struct Product {
  const DeviceTensor* w;
  float* y;
};

// The q8_32 form of one activation vector (kernels/quantize.cuh), reused by every projection in turn.
using Q8Scratch = kernels::Q8Blocks;

// Whether `w` reads its input's q8_32 form (a quantized weight) rather than the floats (a float weight): the one
// rule for whether an activation is quantized, by project() or by the kernel that writes the activation.
inline bool reads_q8(const DeviceTensor& w) { return !w.is_float; }

// The q8_32 form a kernel writing an activation should fill beside its floats for a reader `w`: q8 when `w`
// reads it, none otherwise.
inline Q8Scratch q8_for(const DeviceTensor& w, const Q8Scratch& q8) { return reads_q8(w) ? q8 : Q8Scratch{}; }

// Side streams and the events that fork them from, and join them back into, the calling stream.
class Branches {
 public:
  static constexpr int kMax = 4;  // side streams: up to 5 products of one input run side by side
  Branches();
  ~Branches();
  Branches(const Branches&) = delete;
  Branches& operator=(const Branches&) = delete;

  // Enqueues `launch(i, stream_i)` for i < n: i = 0 on `stream`, the others on side streams that start after
  // everything enqueued on `stream` so far; `stream` continues once all have finished.
  template <class Launch>
  void run(int n, cudaStream_t stream, Launch&& launch) const;

 private:
  cudaStream_t side_[kMax] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_[kMax] = {};
};

// The products of one input vector: as many as can run side by side (Branches).
class Products {
 public:
  static constexpr int kMax = Branches::kMax + 1;
  Products(std::initializer_list<Product> products);  // throws InvalidArgument past kMax
  const Product* begin() const { return list_; }
  const Product* end() const { return list_ + n_; }
  int size() const { return n_; }
  // The first weight that reads the input's q8_32 form (reads_q8), or null when every one reads the floats.
  const DeviceTensor* q8_reader() const;

 private:
  Product list_[kMax] = {};
  int n_ = 0;
};

// The q8_32 form a kernel writing an activation should fill beside its floats for `readers`: q8 when one of
// them reads it, none otherwise.
inline Q8Scratch q8_for(const Products& readers, const Q8Scratch& q8) {
  return readers.q8_reader() ? q8 : Q8Scratch{};
}

template <class Launch>
void Branches::run(int n, cudaStream_t stream, Launch&& launch) const {
  STRATA_EXPECTS(n <= kMax + 1, InvalidArgument, "more parallel branches than side streams");
  if (n > 1) STRATA_CUDA_TRY(cudaEventRecord(fork_, stream));
  for (int i = 1; i < n; ++i) {
    STRATA_CUDA_TRY(cudaStreamWaitEvent(side_[i - 1], fork_, 0));
    launch(i, side_[i - 1]);
    STRATA_CUDA_TRY(cudaEventRecord(join_[i - 1], side_[i - 1]));
  }
  launch(0, stream);
  for (int i = 1; i < n; ++i) STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, join_[i - 1], 0));
}

// Enqueues y = W x for every product; x has the weights' column count. Throws CudaError on a launch error.
void project(const float* x, const Products& products, const Q8Scratch& q8, cudaStream_t stream,
             const Branches* branches = nullptr);

// project() where q8 already holds q8_32(x) for the products that read it (q8_for(products, ...)), written by the
// kernel that produced x (a fused producer saves the quantization's launch on the token's critical path); float
// weights read x.
void project_quantized(const float* x, const Products& products, const Q8Scratch& q8, cudaStream_t stream,
                       const Branches* branches = nullptr);

// Enqueues q8 = q8_32(x) over n floats (n a multiple of 32; rows of a batch may follow one another).
void quantize(const float* x, long n, const Q8Scratch& q8, cudaStream_t stream);

// Enqueues the decode step's router (kernels/router_publish.cuh) of `router` [n_expert][n] on x [n], where q8
// holds q8_32(x) if the router reads it (as for project_quantized: x's producer or quantize_for wrote it): the
// one launch of the GEMV, the top k, out's cache slots and, with publish.ring, the doorbell's publish. Throws
// CudaError.
void route_and_publish(const DeviceTensor& router, const float* x, const Q8Scratch& q8, int k,
                       const kernels::RouteTargets& out, const kernels::RoutePublish& publish, cudaStream_t stream);
// Enqueues q8 = q8_32(x) when one of `readers` reads it (what project() does before its products), for an x
// whose producer does not write its q8_32 form.
void quantize_for(const float* x, const Products& readers, const Q8Scratch& q8, cudaStream_t stream);

// Enqueues the batch's products of a stack of matrices (`stack`'s rows are one matrix's; kernels/gemv.cuh):
// a float stack reads x, a quantized one q8, which the caller has quantized from x. Throws CudaError.
void project_batch(const DeviceTensor& stack, const kernels::MatrixBatch& batch, const float* x, const Q8Scratch& q8,
                   float* y, cudaStream_t stream);

// Enqueues y_i = W x_i for `inputs` (1..rows_per_launch(W)) rows of x, `cols` floats apart (y_i `rows` floats
// apart), each weight row read once for every row of x: a quantized W as one multi-input GEMV over q8 (which the
// caller has quantized from x), each weight block decoded once for every row; a float W as gemv_float_inputs.
// Throws CudaError.
void project_inputs(const DeviceTensor& w, int inputs, const float* x, const Q8Scratch& q8, float* y,
                    cudaStream_t stream);
// The most rows project_inputs takes of W in one launch: kernels::kMaxMmaInputs where the tensor cores multiply
// it (Q8_0, Q5_0, Q4_0: a step of 16 rows reads the matrix once), kMaxFloatInputs for a float W, kMaxGemvInputs
// otherwise.
int rows_per_launch(const DeviceTensor& w);

// Enqueues Y = X W^T over many rows (kernels/matmul.cuh): a float W reads x, a quantized one q8, which the
// caller has quantized from x; with `groups`, over a stack of matrices (`w`'s rows are one matrix's). Throws
// CudaError.
void multiply_rows(const DeviceTensor& w, const kernels::MatmulRows& rows, const kernels::MatmulGroups* groups,
                   const float* x, const Q8Scratch& q8, float* y, cudaStream_t stream);

}  // namespace strata
