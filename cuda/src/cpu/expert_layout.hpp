// Validation of a form descriptor and of one registered expert matrix against its planes' byte sizes.
#pragma once

#include <string>

#include "dot.hpp"

namespace strata::cpu {

// Throws InvalidArgument naming `what` (e.g. "layer 3 gate") unless `m` is a well-formed form with planes
// of exactly n_expert * rows * (bytes per row) bytes, rows x cols as expected, cols <= kMaxCols.
void validate_matrix(const ExpertMatrix& m, int64_t rows, int64_t cols, const std::string& what);

// Expert `e`'s row 0 in every plane of `m`.
MatrixRows expert_rows(const ExpertMatrix& m, int64_t e);

}  // namespace strata::cpu
