// Device helpers for the integer inner sums of the quantized GEMV: unpacking 4 codes per 32-bit word and
// mapping them through a form's value table, ready for __dp4a against four int8 activations.
#pragma once

#include <cstdint>

namespace strata::kernels {

constexpr unsigned kByteOnes = 0x01010101u;

// A codebook's 16 int8 values (strata/forms.hpp), packed 4 per word: a kernel argument, so every codebook
// form of one shape shares a kernel.
struct ValueTable {
  unsigned w[4];
};
constexpr unsigned pack4(int a, int b, int c, int d) {
  return (static_cast<unsigned>(a) & 0xFFu) | ((static_cast<unsigned>(b) & 0xFFu) << 8) |
         ((static_cast<unsigned>(c) & 0xFFu) << 16) | ((static_cast<unsigned>(d) & 0xFFu) << 24);
}
// The packed table of `v` (16 values), all zeros for nullptr (a form without a codebook).
inline ValueTable value_table(const std::int8_t* v) {
  if (v == nullptr) return {};
  return {{pack4(v[0], v[1], v[2], v[3]), pack4(v[4], v[5], v[6], v[7]), pack4(v[8], v[9], v[10], v[11]),
           pack4(v[12], v[13], v[14], v[15])}};
}

// Four codes (0..15, one per byte of `codes`) -> their four int8 table values, one per byte.
// __byte_perm picks bytes from an 8-byte pair by 3-bit selectors, so look up in both halves of the table
// and keep, per byte, the half that the code's bit 3 names.
__device__ __forceinline__ int lookup16(unsigned codes, const ValueTable& t) {
  const unsigned low3 = codes & 0x07070707u;
  const unsigned spread = low3 | (low3 >> 4);                    // byte 0: c0 | c1 << 4, byte 2: c2 | c3 << 4
  const unsigned selector = (spread & 0xFFu) | ((spread >> 8) & 0xFF00u);
  const unsigned from_low = __byte_perm(t.w[0], t.w[1], selector);
  const unsigned from_high = __byte_perm(t.w[2], t.w[3], selector);
  const unsigned high_mask = ((codes >> 3) & kByteOnes) * 0xFFu;
  return static_cast<int>((from_low & ~high_mask) | (from_high & high_mask));
}

}  // namespace strata::kernels
