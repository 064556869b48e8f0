// The canonical weight forms of docs/forms.md as the native core sees them: a small descriptor that the
// GEMV kernels, the session and the CPU expert pool share, and the device planes of one tensor.
// Host-only (no CUDA headers): Cython compiles it with the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

// Float forms hold the GGUF data unchanged, row-major [rows][cols]; x is float32.
enum class FloatKind : std::int32_t { F32 = 0, F16 = 1, BF16 = 2 };

// Bytes of one element of a float form.
constexpr std::size_t float_kind_bytes(FloatKind kind) noexcept { return kind == FloatKind::F32 ? 4 : 2; }

// Which value table a form's codes index; None means v = code - code_bias. One table per distinct value set
// (strata.quant.forms): the lattice i-quants' codes are a magnitude index | sign << 3 (IQ1: | delta < 0 << 2).
enum class Codebook : std::int32_t { None = 0, Iq4Nl = 1, Mxfp4 = 2, Iq2 = 3, Iq3Xxs = 4, Iq3S = 5, Iq1 = 6 };

// The values a 4-bit code indexes in a codebook form: IQ4_NL's non-linear grid, MXFP4's e2m1 doubled, the
// signed grid magnitudes of IQ2_XXS / IQ2_XS / IQ2_S, IQ3_XXS and IQ3_S, and IQ1_S / IQ1_M's 8 * (g +- 1/8).
inline constexpr std::int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr std::int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
inline constexpr std::int8_t kIq2Values[16] = {8, 25, 43, 0, 0, 0, 0, 0, -8, -25, -43, 0, 0, 0, 0, 0};
inline constexpr std::int8_t kIq3XxsValues[16] = {4,  12,  20,  28,  36,  44,  52,  62,
                                                  -4, -12, -20, -28, -36, -44, -52, -62};
inline constexpr std::int8_t kIq3SValues[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};
inline constexpr std::int8_t kIq1Values[16] = {-7, 1, 9, 0, -9, -1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0};

// The 16 values of `codebook`, or nullptr for Codebook::None (or an id no table has).
constexpr const std::int8_t* codebook_values(Codebook codebook) noexcept {
  switch (codebook) {
    case Codebook::Iq4Nl: return kIq4NlValues;
    case Codebook::Mxfp4: return kMxfp4Values;
    case Codebook::Iq2: return kIq2Values;
    case Codebook::Iq3Xxs: return kIq3XxsValues;
    case Codebook::Iq3S: return kIq3SValues;
    case Codebook::Iq1: return kIq1Values;
    default: return nullptr;
  }
}

// One quantized form: how codes, scales and offsets combine (docs/forms.md, "The quantized form").
struct QuantForm {
  std::int32_t code_bits = 0;     // 2, 4 or 8
  std::int32_t code_bias = 0;     // v = code - code_bias when codebook == None
  Codebook codebook = Codebook::None;
  std::int32_t group_size = 0;    // 16 or 32
  std::int32_t super_size = 0;    // 32 or 256
  bool scale_f32 = false;         // d is float32 (MXFP4, the folded i-quants) instead of float16
  bool has_sub_scales = false;    // int8 sub_scales per group (only when group_size != super_size)
  bool has_mins = false;          // float16 mins per super-block (+ uint8 sub_mins per group with sub-scales)
};

// The planes of one rows x cols quantized tensor, each row-major with one row per weight row. A plane the
// form lacks is nullptr. Pointers are device pointers for the GPU kernels, host pointers for the CPU pool.
struct QuantPlanes {
  const std::uint8_t* codes = nullptr;       // [rows][cols * code_bits / 8]
  const void* d = nullptr;                   // [rows][cols / super_size], float16 bits or float32
  const std::int8_t* sub_scales = nullptr;   // [rows][cols / group_size]
  const std::uint16_t* mins = nullptr;       // [rows][cols / super_size], float16 bits
  const std::uint8_t* sub_mins = nullptr;    // [rows][cols / group_size]
};

// Bytes of each plane of a rows x cols tensor of `form` (0 for a plane the form lacks).
struct PlaneBytes {
  std::size_t codes = 0, d = 0, sub_scales = 0, mins = 0, sub_mins = 0;
  std::size_t total() const noexcept { return codes + d + sub_scales + mins + sub_mins; }
};

inline PlaneBytes plane_bytes(const QuantForm& form, std::size_t rows, std::size_t cols) noexcept {
  PlaneBytes b;
  const std::size_t supers = form.super_size > 0 ? cols / form.super_size : 0;
  const std::size_t groups = form.group_size > 0 ? cols / form.group_size : 0;
  b.codes = rows * cols * form.code_bits / 8;
  b.d = rows * supers * (form.scale_f32 ? 4 : 2);
  if (form.has_sub_scales) b.sub_scales = rows * groups;
  if (form.has_mins) b.mins = rows * supers * 2;
  if (form.has_mins && form.has_sub_scales) b.sub_mins = rows * groups;
  return b;
}

}  // namespace strata
