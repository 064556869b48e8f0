// The compile-time shapes of docs/forms.md's quantized forms, shared by the GEMV (gemv_quant.cu) and the matrix
// product (matmul_quant.cu): each kernel family instantiates one kernel per shape and dispatches a runtime form
// descriptor to the shape it matches.
#pragma once

#include "strata/forms.hpp"

namespace strata::kernels {

constexpr int kCodeBlock = 32;  // elements per code block and per q8_32 activation block

// The compile-time shape of a form; code_bias and the codebook's values stay runtime values (the bias only
// shifts the codes, the values are a lookup table), so forms differing only in those share a kernel.
template <int Bits, int Group, int Super, bool Book, bool ScaleF32, bool SubScales, bool Mins>
struct Shape {
  static constexpr int kBits = Bits, kGroup = Group, kSuper = Super;
  static constexpr int kGroupsPerBlock = kCodeBlock / Group;
  static constexpr int kCodeWords = kCodeBlock * Bits / 8 / 4;  // 32-bit words of codes per block
  static constexpr bool kBook = Book;  // codes index a 16-entry value table
  static constexpr bool kScaleF32 = ScaleF32, kSubScales = SubScales, kMins = Mins;
};

template <class S>
bool matches(const QuantForm& f) {
  const bool book = f.codebook != Codebook::None;
  return f.code_bits == S::kBits && f.group_size == S::kGroup && f.super_size == S::kSuper && book == S::kBook &&
         (!book || codebook_values(f.codebook) != nullptr) && f.scale_f32 == S::kScaleF32 &&
         f.has_sub_scales == S::kSubScales && f.has_mins == S::kMins;
}

template <class... Shapes>
struct ShapeList {
  static bool contains(const QuantForm& form) { return (matches<Shapes>(form) || ...); }

  // Calls visit(S{}) for the shape S that `form` matches; false if it matches none.
  template <class Visit>
  static bool visit(const QuantForm& form, Visit&& visit) {
    return ((matches<Shapes>(form) && (visit(Shapes{}), true)) || ...);
  }
};

// The distinct shapes of docs/forms.md's table (types differing only in code_bias or codebook share one).
using KnownShapes = ShapeList<
    Shape<8, 32, 32, false, false, false, false>,   // Q8_0, Q5_0
    Shape<4, 32, 32, false, false, false, false>,   // Q4_0
    Shape<4, 32, 32, false, false, false, true>,    // Q4_1
    Shape<8, 32, 32, false, false, false, true>,    // Q5_1
    Shape<2, 16, 256, false, false, true, true>,    // Q2_K
    Shape<8, 16, 256, false, false, true, false>,   // Q3_K, Q6_K
    Shape<4, 32, 256, false, false, true, true>,    // Q4_K
    Shape<8, 32, 256, false, false, true, true>,    // Q5_K
    Shape<2, 32, 256, false, false, true, false>,   // TQ1_0, TQ2_0
    Shape<4, 32, 32, true, false, false, false>,    // IQ4_NL
    Shape<4, 32, 32, true, true, false, false>,     // MXFP4
    Shape<4, 32, 256, true, false, true, false>,    // IQ4_XS, IQ3_S
    Shape<4, 32, 256, true, true, true, false>,     // IQ2_XXS, IQ3_XXS, IQ1_S
    Shape<4, 16, 256, true, true, true, false>>;    // IQ2_XS, IQ2_S, IQ1_M

}  // namespace strata::kernels
