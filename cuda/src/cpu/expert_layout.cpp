#include "expert_layout.hpp"

#include "strata/error.hpp"

namespace strata::cpu {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void validate_form(const QuantForm& f, const std::string& what) {
  const std::string where = what + ": form ";
  STRATA_EXPECTS(f.code_bits == 2 || f.code_bits == 4 || f.code_bits == 8, InvalidArgument,
                 where + "code_bits must be 2, 4 or 8, found " + str(f.code_bits));
  STRATA_EXPECTS(f.group_size == 16 || f.group_size == 32, InvalidArgument,
                 where + "group_size must be 16 or 32, found " + str(f.group_size));
  STRATA_EXPECTS(f.super_size == 32 || f.super_size == 256, InvalidArgument,
                 where + "super_size must be 32 or 256, found " + str(f.super_size));
  STRATA_EXPECTS(f.super_size >= f.group_size, InvalidArgument,
                 where + "super_size " + str(f.super_size) + " is smaller than group_size " + str(f.group_size));
  STRATA_EXPECTS(f.has_sub_scales == (f.super_size != f.group_size), InvalidArgument,
                 where + "sub_scales must exist exactly when super_size != group_size (" + str(f.super_size) +
                     " vs " + str(f.group_size) + ")");
  STRATA_EXPECTS(f.codebook == Codebook::None || codebook_values(f.codebook) != nullptr, InvalidArgument,
                 where + "unknown codebook " + str(static_cast<int64_t>(f.codebook)));
  STRATA_EXPECTS(f.codebook == Codebook::None || f.code_bits == 4, InvalidArgument,
                 where + "a codebook needs 4-bit codes, found " + str(f.code_bits));
  STRATA_EXPECTS(f.code_bias >= 0 && f.code_bias <= 255, InvalidArgument,
                 where + "code_bias must be in 0..255, found " + str(f.code_bias));
}

void check_plane(const Plane& p, int64_t expected, const std::string& what, const char* name) {
  if (expected == 0) {
    STRATA_EXPECTS(p.data == nullptr && p.nbytes == 0, InvalidArgument,
                   what + ": the form has no " + name + " plane, but one of " + str(p.nbytes) + " bytes was given");
    return;
  }
  STRATA_EXPECTS(p.data != nullptr, InvalidArgument, what + ": plane " + name + " is missing");
  STRATA_EXPECTS(p.nbytes == expected, InvalidArgument,
                 what + ": plane " + name + " has " + str(p.nbytes) + " bytes, expected " + str(expected));
}

// The bytes of each plane of `rows` rows of `m` (a float matrix has only `codes`: its elements).
PlaneBytes matrix_plane_bytes(const ExpertMatrix& m, int64_t rows) {
  const auto r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(m.cols);
  if (!m.is_float) return plane_bytes(m.form, r, c);
  PlaneBytes b;
  b.codes = r * c * float_kind_bytes(m.float_kind);
  return b;
}

}  // namespace

void validate_matrix(const ExpertMatrix& m, int64_t rows, int64_t cols, const std::string& what) {
  validate_shape(m, rows, cols, what);
  const PlaneBytes b = matrix_plane_bytes(m, m.n_expert * rows);
  check_plane(m.codes, static_cast<int64_t>(b.codes), what, m.is_float ? "codes (the float elements)" : "codes");
  check_plane(m.d, static_cast<int64_t>(b.d), what, "d");
  check_plane(m.sub_scales, static_cast<int64_t>(b.sub_scales), what, "sub_scales");
  check_plane(m.mins, static_cast<int64_t>(b.mins), what, "mins");
  check_plane(m.sub_mins, static_cast<int64_t>(b.sub_mins), what, "sub_mins");
}

void validate_shape(const ExpertMatrix& m, int64_t rows, int64_t cols, const std::string& what) {
  if (m.is_float) {
    STRATA_EXPECTS(m.float_kind == FloatKind::F32 || m.float_kind == FloatKind::F16 || m.float_kind == FloatKind::BF16,
                   InvalidArgument, what + ": unknown float kind " + str(static_cast<int64_t>(m.float_kind)));
  } else {
    validate_form(m.form, what);
  }
  STRATA_EXPECTS(m.n_expert >= 1, InvalidArgument, what + ": n_expert must be >= 1, found " + str(m.n_expert));
  STRATA_EXPECTS(m.rows == rows && m.cols == cols, InvalidArgument,
                 what + ": expected " + str(rows) + " x " + str(cols) + " per expert, found " + str(m.rows) + " x " +
                     str(m.cols));
  const int64_t multiple = m.is_float ? 32 : m.form.super_size;
  const std::string rule =
      m.is_float ? "32 (the float kernels read whole 32-element blocks)" : "super_size " + str(multiple);
  STRATA_EXPECTS(cols % multiple == 0, InvalidArgument,
                 what + ": cols " + str(cols) + " is not a multiple of " + rule);
  STRATA_EXPECTS(cols <= kMaxCols, InvalidArgument,
                 what + ": cols " + str(cols) + " exceeds the limit " + str(kMaxCols));
}

PlaneBytes expert_plane_bytes(const ExpertMatrix& m) { return matrix_plane_bytes(m, m.rows); }

MatrixRows expert_rows(const ExpertMatrix& m, int64_t e) {
  const PlaneBytes rb = matrix_plane_bytes(m, 1);  // bytes per row
  const int64_t first = e * m.rows;
  auto at = [first](const Plane& p, std::size_t per_row) {
    return p.data == nullptr ? nullptr : static_cast<const uint8_t*>(p.data) + first * static_cast<int64_t>(per_row);
  };
  MatrixRows rows;
  rows.form = &m.form;
  rows.cols = m.cols;
  rows.codes = at(m.codes, rb.codes);
  rows.d = at(m.d, rb.d);
  rows.sub_scales = reinterpret_cast<const int8_t*>(at(m.sub_scales, rb.sub_scales));
  rows.mins = reinterpret_cast<const uint16_t*>(at(m.mins, rb.mins));
  rows.sub_mins = at(m.sub_mins, rb.sub_mins);
  return rows;
}

RowsKernel matrix_kernel(Isa isa, const ExpertMatrix& m) {
  return m.is_float ? float_rows_kernel(isa, m.float_kind) : rows_kernel(isa, m.form);
}

}  // namespace strata::cpu
