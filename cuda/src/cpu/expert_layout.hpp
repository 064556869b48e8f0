// Validation of a form descriptor and of one registered expert matrix against its planes' byte sizes; the
// row kernel a matrix takes.
#pragma once

#include <string>

#include "dot.hpp"

namespace strata::cpu {

// Throws InvalidArgument naming `what` (e.g. "layer 3 gate") unless `m` is a well-formed form with planes
// of exactly n_expert * rows * (bytes per row) bytes, rows x cols as expected, cols <= kMaxCols (and, for a
// float matrix, a multiple of 32: the float kernels read whole 32-element blocks).
void validate_matrix(const ExpertMatrix& m, int64_t rows, int64_t cols, const std::string& what);

// validate_matrix without the planes: the form, the expert count and the shape (a tiered layer's matrices, whose
// experts are in the pool's arena and the file, not in planes of the caller's).
void validate_shape(const ExpertMatrix& m, int64_t rows, int64_t cols, const std::string& what);

// The bytes of each plane of one expert of `m` (a float matrix has only `codes`: its elements).
PlaneBytes expert_plane_bytes(const ExpertMatrix& m);

// Expert `e`'s row 0 in every plane of `m`.
MatrixRows expert_rows(const ExpertMatrix& m, int64_t e);

// The row kernel of `m`'s form (float or quantized) on a resolved `isa`.
RowsKernel matrix_kernel(Isa isa, const ExpertMatrix& m);

}  // namespace strata::cpu
