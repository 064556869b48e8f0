// GEMV y = W x for one activation vector (batch 1, memory-bound): one warp per weight row.
// Launchers never allocate, synchronise or throw: they are capturable into CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/forms.hpp"

namespace strata::kernels {

// A weight matrix as the GEMVs read it, for the kernels that run their row dots in their own launch
// (router_publish.cuh, hc_read.cuh): float (kind, data) or quantized (form, planes), row-major.
struct WeightMatrix {
  bool is_float = false;
  FloatKind kind = FloatKind::F32;
  const void* data = nullptr;
  QuantForm form;
  QuantPlanes planes;
};

// Quantized forms (docs/forms.md). x arrives as q8_32 (quantize_q8_32): xq [cols], dx and sums [cols / 32].
// Every inner sum over a group is exact int32 (__dp4a); groups are scaled and summed in float32.
// Supports exactly the forms of the table "From GGUF types"; any other descriptor -> cudaErrorInvalidValue.
// `codes` must be 16-byte aligned (8 for 2-bit codes); cols a multiple of super_size.
cudaError_t gemv_quant(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                       const std::int8_t* xq, const float* dx, const std::int32_t* xsums, float* y,
                       cudaStream_t stream);

// True when gemv_quant has a kernel for `form` (every form of docs/forms.md).
bool gemv_quant_supports(const QuantForm& form);

// The checks gemv_quant makes of its operands (a known form, cols a multiple of its super-block, the codes'
// and xq's alignment), for the kernels that run its row dot in their own launch (router_publish.cuh):
// cudaSuccess, cudaErrorInvalidValue or cudaErrorMisalignedAddress.
cudaError_t gemv_quant_operands(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                                const std::int8_t* xq);

// Float forms: W [rows][cols] of `kind` (f32, f16 bits, bf16 bits), x float32 [cols], y float32 [rows].
cudaError_t gemv_float(FloatKind kind, const void* w, int rows, int cols, const float* x, float* y,
                       cudaStream_t stream);

// A float W times several activations, y_i = W x_i for i < inputs (1..kMaxFloatInputs), x_i = x + i * x_stride
// (x_stride >= cols), y_i = y + i * rows: each row of W loaded once for every input (a step's router, where a batch
// of products of W re-read it from L2 for each row), each y_i the bits of gemv_float's of x_i. Refused with
// cudaErrorInvalidValue: inputs outside 1..kMaxFloatInputs, x_stride < cols, what gemv_float refuses.
constexpr int kMaxFloatInputs = 16;
cudaError_t gemv_float_inputs(FloatKind kind, const void* w, int rows, int cols, int inputs, int x_stride,
                              const float* x, float* y, cudaStream_t stream);

// `count` products in one launch, y_j = M[slots[j]] x_j for j < count, over a stack of matrices M of rows x cols
// each, stored matrix-major in every plane (matrix m's row r is the stack's row m * rows + r): a layer's routed
// experts, or the slots of its VRAM cache. slots lives in device memory, so a captured graph reads each
// token's; slots[j] < 0 skips product j and leaves y_j unwritten. y_j = y + j * rows. x_j starts x_stride
// elements after x_{j-1} (0: every product reads the same x); for the quantized forms that is xq + j * x_stride
// and dx, xsums + j * x_stride / 32, so x_stride is a multiple of 32.
// slots == nullptr means one product of matrix 0 (count 1): gemv_quant and gemv_float are that case, which
// compiles to the kernel without the batch's offsets (the same loop, so the same results bit for bit). The
// caller keeps slots within its stack (the kernels cannot know its size). Every matrix keeps the stack's
// alignment: a quantized row's codes are cols * code_bits / 8 bytes, a multiple of 8 (2-bit codes) or 16 since
// cols is a multiple of 32; a float row takes the 16-byte vector path when cols * element bytes and, for x,
// x_stride * 4 are multiples of 16. Plane offsets are 64-bit: 512 experts of 640 x 2560 are 3.4 GB in f32.
// Refused with cudaErrorInvalidValue: count outside 1..kMaxBatchProducts, a null slots with count > 1, a split
// other than 0, 1, 2 or 4,
// x_stride < 0 (or, for the quantized forms, not a multiple of 32), count times the row tiles past 2^31 - 1
// (the products and the tiles share the grid's x dimension, gemv_rows.cuh).
constexpr int kMaxBatchProducts = 65535;

// Warps per row (1, 2 or 4) for a matrix of `rows` rows.
inline int row_split(int rows) { return rows >= 2048 ? 1 : rows >= 1024 ? 2 : 4; }

// Warps per row for a batch of `products` products of `rows`-row matrices, whose CTAs run side by side: together
// they put in flight the loads that a split adds to one matrix alone. The box measured the routed experts' gate
// matrices (640 x 2560, Q4_K) at one warp a row against the four their rows alone take: 10 products 7.9 us against
// 10.2, 80 products 28.2 against 63.9 (bench_gemv_batch.py, H100, 2026-12-06). The routed experts pass their top k
// as `products`, not the step's rows times it, so that a row's bits do not depend on the rows beside it.
inline int side_by_side_split(int rows, int products) { return row_split(rows * products); }

struct MatrixBatch {
  const int* slots = nullptr;
  int count = 0;
  int x_stride = 0;
  int split = 0;  // warps per weight row: 0 the kernels' rule (gemv_rows.cuh), else 1, 2 or 4 (benchmarks' choice)
};

cudaError_t gemv_quant_batch(const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
                             const MatrixBatch& batch, const std::int8_t* xq, const float* dx,
                             const std::int32_t* xsums, float* y, cudaStream_t stream);
cudaError_t gemv_float_batch(FloatKind kind, const void* w, int rows, int cols, const MatrixBatch& batch,
                             const float* x, float* y, cudaStream_t stream);

// One matrix times several activations, y_i = W x_i for i < inputs (1..kMaxGemvInputs): the rows of a step
// (docs/rows.md) through one matrix, each weight block loaded and decoded once for all of them, where a batch of
// `inputs` products of matrix 0 decodes it once per product. Input i's q8_32 form starts i * x_stride elements
// after input 0's (x_stride >= cols, a multiple of 32); y_i = y + i * rows. Each y_i is, bit for bit, gemv_quant's
// of x_i, whichever kernel runs it: the integer walk (dp4a, every form, up to kMaxGemvInputs inputs) or, for the
// forms of one scale a 32-element block (Q8_0, Q5_0, Q4_0), the tensor cores (gemv_quant_mma.cuh, up to
// kMaxMmaInputs). `kernel` is the caller's choice of the two for the tests and benchmarks; kChosen takes the tensor
// cores from kMmaMinInputs inputs where they take the form. Measured (bench_gemv_inputs.py --quick, H100,
// 2026-12-06, ninth session, the scales staged with the codes): over the five Q8_0 shapes of a layer the tensor
// cores took 77, 80, 88 and 130 us at 2, 4, 8 and 16 rows where the integer walk took 61, 75, 108 and 216 (16: two
// launches); their time barely grows with the rows (26 us for attn_qkvz at 1 row, where the one-row walk takes 20),
// so they win from 8 rows. Refused with cudaErrorInvalidValue: inputs outside 1..the kernel's bound, a bad
// x_stride, what gemv_quant refuses, or the tensor cores asked for a form or width they do not take.
constexpr int kMaxGemvInputs = 8;
constexpr int kMaxMmaInputs = 16;
enum class InputsKernel { kChosen, kInteger, kTensorCores };
constexpr int kMmaMinInputs = 8;

// The most inputs one gemv_quant_inputs launch of `kernel` takes for a `rows` x `cols` matrix in `form`, on the
// current device.
int gemv_quant_max_inputs(const QuantForm& form, int rows, int cols, InputsKernel kernel = InputsKernel::kChosen);

cudaError_t gemv_quant_inputs(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                              int x_stride, const std::int8_t* xq, const float* dx, const std::int32_t* xsums,
                              float* y, cudaStream_t stream, InputsKernel kernel = InputsKernel::kChosen);

}  // namespace strata::kernels
