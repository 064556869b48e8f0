// A step's rows times one matrix on the int8 tensor cores, with the one-row GEMV's bits (gemv_quant_inputs'
// kernel for the forms of one scale a 32-element block: Q8_0, Q5_0, Q4_0; gemv_quant_mma.cu).
//
// Why the order matters: a verification row must be, bit for bit, the plain decode step of its token (drafts are
// exact), and a batched session's row what the session alone gives. The one-row GEMV sums a row in a fixed float
// order: lane l of part p (of `split` warps a row) adds the terms of blocks p * 32 + l, + 32 * split, ... in turn;
// the warp's butterfly (reduce.cuh) adds the 32 lanes' sums as a pairwise tree whose leaves, read in the
// bit-reversed order of the lane (0, 16, 8, 24, 4, ...), are adjacent pairs, then pairs of pairs; the parts are
// added in turn after. A tensor-core kernel keeps that order where it walks a (part, lane class) leaf at a time,
// its blocks in turn, and folds the leaves as the same tree: a warp takes an aligned run of bit-reversed positions
// (a subtree), the CTA adds the warps' subtrees as the levels above. Each block's integer dot is exact either way
// (dp4a or mma), and its float part is the one of gemv_quant_rows.cuh (quant_rows::block_term, add_block).
//
// How it reads the weights: a cluster of `split` CTAs a 16-row tile (sm_90's thread block clusters), CTA p the
// part's chunks of 32 blocks (one block of each of its lane classes; chunks p, p + split, ...), codes and scales
// staged in shared memory by cp.async a few chunks ahead of the one computed, so the loads of the next chunks fly
// while a chunk is computed; each warp carries its leaves' sums across the chunks. The first CTA of the cluster adds
// the parts' sums, read from the others' shared memory. A matrix of few rows so gets split x the CTAs of its tiles;
// one of more tiles than the device holds CTAs at once gets as many clusters as it holds, each walking its tiles as
// one sequence of chunks (the next tile's in flight while this one's are computed and folded).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemv.cuh"
#include "gemv_quant_rows.cuh"
#include "strata/forms.hpp"

namespace strata::kernels {

// Whether the tensor-core kernel takes `form` at `cols` columns: the forms of one f16 scale a 32-element block
// without mins or a table, at an even count of blocks a row (a chunk's scales are staged in 4-byte words).
bool gemv_quant_mma_takes(const QuantForm& form, int cols);

// Whether the scales' plane starts 4-byte aligned, as the kernel's staged words ask (the planes this engine places
// all do; a view into another buffer may not).
bool gemv_quant_mma_aligned(const QuantPlanes& planes);

// Whether it runs a matrix of `rows` x `cols` in `form` on the current device: gemv_quant_mma_takes, and a matrix
// of one warp a row (row_split 1) or a device with thread block clusters (compute capability 9.0 and later).
bool gemv_quant_mma_runs(const QuantForm& form, int rows, int cols);

// y_i = W x_i for i < inputs (1..kMaxMmaInputs), each y_i the bits of gemv_quant's of x_i; the operands as
// gemv_quant_inputs has them (already checked by it). cudaErrorInvalidValue where gemv_quant_mma_runs or
// gemv_quant_mma_aligned is false.
cudaError_t gemv_quant_mma(const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs,
                           const StridedQ8& acts, float* y, cudaStream_t stream);

}  // namespace strata::kernels
