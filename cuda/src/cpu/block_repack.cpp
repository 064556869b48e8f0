// One function per block type, over one block: each writes what strata/quant/repack_kernels.py writes for that
// block, element by element where the numpy kernels move words at a time (their comments give the element
// order of each type, as gguf-py's quants.py documents it). Canonical code packing per 32-element block:
// 8-bit: byte j = code j; 4-bit: byte j = code j | code j+16 << 4; 2-bit: byte j = sum over i of code j+8i << 2i.
#include "block_repack.hpp"

#include <cstring>
#include <string>

#include "strata/error.hpp"

namespace strata::cpu {
namespace {

using u8 = std::uint8_t;

struct Out {
  u8* codes;
  u8* d;
  u8* sub_scales;
  u8* mins;
  u8* sub_mins;
};

using BlockFn = void (*)(const u8* b, const Out& o);

void copy_f16(const u8* src, u8* dst) { std::memcpy(dst, src, 2); }

// K-quants store dmin and subtract it; the form stores -dmin and adds (a sign flip, exact).
void copy_negated_f16(const u8* src, u8* dst) {
  dst[0] = src[0];
  dst[1] = static_cast<u8>(src[1] ^ 0x80);
}

// 32 one-byte codes (each < 4) packed as the form's 2-bit block.
void pack_crumbs(const u8* codes32, u8* out) {
  for (int j = 0; j < 8; ++j) {
    out[j] = static_cast<u8>(codes32[j] | codes32[8 + j] << 2 | codes32[16 + j] << 4 | codes32[24 + j] << 6);
  }
}

// Q2_K / TQ2_0 qs (64 bytes): per 128 elements, element 32k + l sits in bits 2k of qs[32h + l]. Each group of 32
// codes (h, k) packs as pack_crumbs does, eight bytes at once: byte j of word m is qs[32h + 8m + j] (the words
// little-endian, as x86 reads them), so its crumb k shifted down and masked per byte is code 8m + j of the group,
// and the four words' crumbs moved up 2m bits each are the group's eight packed bytes.
void crumb_columns(const u8* qs, u8* codes) {
  constexpr std::uint64_t kLowCrumbs = 0x0303030303030303ull;
  for (int h = 0; h < 2; ++h) {
    std::uint64_t words[4];
    std::memcpy(words, qs + 32 * h, sizeof(words));
    for (int k = 0; k < 4; ++k) {
      std::uint64_t packed = 0;
      for (int m = 0; m < 4; ++m) packed |= ((words[m] >> (2 * k)) & kLowCrumbs) << (2 * m);
      std::memcpy(codes + 8 * (4 * h + k), &packed, sizeof(packed));
    }
  }
}

// Q5_0 / Q5_1: 16 bytes of nibbles (code j low, j + 16 high) and bit 4 of code j in bit j of the LE u32 qh.
void fifth_bit_codes(const u8* qh, const u8* qs, u8* codes) {
  std::uint32_t high;
  std::memcpy(&high, qh, 4);  // little-endian, as the file
  u8 out[32];  // local, as q4_k's: the codes might alias qs for all the compiler knows
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<u8>((qs[j] & 0x0F) | ((high >> j) & 1) << 4);
    out[j + 16] = static_cast<u8>((qs[j] >> 4) | ((high >> (j + 16)) & 1) << 4);
  }
  std::memcpy(codes, out, sizeof(out));
}

// Q4_K / Q5_K: d | dmin | 12 bytes of 8 six-bit scales and 8 six-bit mins.
void k_scales_and_mins(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  copy_negated_f16(b + 2, o.mins);
  const u8* s = b + 4;
  for (int i = 0; i < 4; ++i) {
    o.sub_scales[i] = s[i] & 63;
    o.sub_scales[4 + i] = static_cast<u8>((s[8 + i] & 0x0F) | (s[i] >> 6) << 4);
    o.sub_mins[i] = s[4 + i] & 63;
    o.sub_mins[4 + i] = static_cast<u8>((s[8 + i] >> 4) | (s[4 + i] >> 6) << 4);
  }
}

void q8_0(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  for (int j = 0; j < 32; ++j) o.codes[j] = static_cast<u8>(b[2 + j] ^ 0x80);  // int8 q -> q + 128
}

void q4_0(const u8* b, const Out& o) {  // also IQ4_NL: the same block, the same packing
  copy_f16(b, o.d);
  std::memcpy(o.codes, b + 2, 16);
}

void q4_1(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  copy_f16(b + 2, o.mins);
  std::memcpy(o.codes, b + 4, 16);
}

void q5_0(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  fifth_bit_codes(b + 2, b + 6, o.codes);
}

void q5_1(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  copy_f16(b + 2, o.mins);
  fifth_bit_codes(b + 4, b + 8, o.codes);
}

// e8m0 exponent -> 2^(e - 128) as float32 bits (ggml's "half" scale: the e2m1 values are doubled).
void mxfp4(const u8* b, const Out& o) {
  const std::uint32_t e = b[0];
  const std::uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
  std::memcpy(o.d, &bits, 4);
  std::memcpy(o.codes, b + 1, 16);
}

void q2_k(const u8* b, const Out& o) {  // scales[16] | qs[64] | d | dmin
  for (int i = 0; i < 16; ++i) {
    o.sub_scales[i] = b[i] & 0x0F;
    o.sub_mins[i] = b[i] >> 4;
  }
  copy_f16(b + 80, o.d);
  copy_negated_f16(b + 82, o.mins);
  crumb_columns(b + 16, o.codes);
}

void tq2_0(const u8* b, const Out& o) {  // qs[64] as Q2_K's | d; sub-scales of 1
  crumb_columns(b, o.codes);
  copy_f16(b + 64, o.d);
  std::memset(o.sub_scales, 1, 8);
}

// qs[48] | qh[4] | d. A byte holds 5 base-3 digits (qh: 4): digit p of x is (x * 3^p mod 256 >= 86) + (... >= 171).
// Digit p of qs[l] is element 32p + l (l < 32) or 160 + 16p + (l - 32); digit p of qh[l] is element 240 + 4p + l.
void tq1_0(const u8* b, const Out& o) {
  static constexpr u8 kPow3[5] = {1, 3, 9, 27, 81};
  u8 codes[256];
  auto digit = [](u8 x, int p) {
    const u8 shifted = static_cast<u8>(x * kPow3[p]);
    return static_cast<u8>((shifted >= 86) + (shifted >= 171));
  };
  for (int p = 0; p < 5; ++p) {
    for (int l = 0; l < 32; ++l) codes[32 * p + l] = digit(b[l], p);
    for (int l = 32; l < 48; ++l) codes[160 + 16 * p + (l - 32)] = digit(b[l], p);
    if (p < 4) {
      for (int l = 0; l < 4; ++l) codes[240 + 4 * p + l] = digit(b[48 + l], p);
    }
  }
  for (int c = 0; c < 8; ++c) pack_crumbs(codes + 32 * c, o.codes + 8 * c);
  copy_f16(b + 52, o.d);
  std::memset(o.sub_scales, 1, 8);
}

// hmask[32] | qs[64] | scales[12] | d. Element 128h + 32s + l: low 2 bits in bits 2s of qs[32h + l], high bit in
// bit 4h + s of hmask[l]; code = low + 4 * high. Scale i: its low nibble in byte i % 8 of scales (nibble i / 8),
// its top 2 bits in byte 8 + i % 4 (bits 2 * (i / 4)); the form keeps scale - 32.
void q3_k(const u8* b, const Out& o) {
  const u8 *hmask = b, *qs = b + 32, *scales = b + 96;
  copy_f16(b + 108, o.d);
  for (int i = 0; i < 16; ++i) {
    const int low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F, high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    o.sub_scales[i] = static_cast<u8>((low | high << 4) - 32);
  }
  u8 q[64], mask[32], codes[256];  // local, as q4_k's
  std::memcpy(q, qs, sizeof(q));
  std::memcpy(mask, hmask, sizeof(mask));
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int low = (q[32 * h + l] >> (2 * s)) & 3, high = (mask[l] >> (4 * h + s)) & 1;
        codes[128 * h + 32 * s + l] = static_cast<u8>(low + 4 * high);
      }
    }
  }
  std::memcpy(o.codes, codes, sizeof(codes));
}

// Per 64 elements, 32 bytes of qs: low nibbles hold elements 0..31, high nibbles 32..63.
void q4_k(const u8* b, const Out& o) {
  k_scales_and_mins(b, o);
  // Through local copies: the planes might alias the block for all the compiler knows, which kept these loops
  // scalar (a byte at a time, the tier's largest repack cost); local arrays let them run 16 bytes at once.
  u8 q[128], codes[128];
  std::memcpy(q, b + 16, sizeof(q));
  for (int c = 0; c < 4; ++c) {
    for (int j = 0; j < 16; ++j) {  // the chunk's first 32 elements, then its last 32
      codes[32 * c + j] = static_cast<u8>((q[32 * c + j] & 0x0F) | (q[32 * c + 16 + j] & 0x0F) << 4);
      codes[32 * c + 16 + j] = static_cast<u8>((q[32 * c + j] >> 4) | (q[32 * c + 16 + j] & 0xF0));
    }
  }
  std::memcpy(o.codes, codes, sizeof(codes));
}

// ... | qh[32] | qs[128]. Element 64c + 32t + l: nibble t of qs[32c + l], bit 4 in bit 2c + t of qh[l].
void q5_k(const u8* b, const Out& o) {
  k_scales_and_mins(b, o);
  u8 qh[32], qs[128], codes[256];  // local, as q4_k's
  std::memcpy(qh, b + 16, sizeof(qh));
  std::memcpy(qs, b + 48, sizeof(qs));
  for (int c = 0; c < 4; ++c) {
    for (int t = 0; t < 2; ++t) {
      for (int l = 0; l < 32; ++l) {
        codes[64 * c + 32 * t + l] =
            static_cast<u8>(((qs[32 * c + l] >> (4 * t)) & 0x0F) | ((qh[l] >> (2 * c + t)) & 1) << 4);
      }
    }
  }
  std::memcpy(o.codes, codes, sizeof(codes));
}

// ql[128] | qh[64] | scales[16] int8 | d. Element 128h + r: nibble r / 64 of ql[64h + r % 64], bits 4..5 in
// bits 2 * (r / 32) of qh[32h + r % 32]. Code = value + 32.
void q6_k(const u8* b, const Out& o) {
  u8 ql[128], qh[64], codes[256];  // local, as q4_k's
  std::memcpy(ql, b, sizeof(ql));
  std::memcpy(qh, b + 128, sizeof(qh));
  std::memcpy(o.sub_scales, b + 192, 16);
  copy_f16(b + 208, o.d);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 128; r += 32) {  // r / 64 and r / 32 constant over a run of 32 (the loop vectorizes)
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[64 * h + r % 64 + l] >> (4 * (r / 64))) & 0x0F;
        const int high = (qh[32 * h + l] >> (2 * (r / 32))) & 3;
        codes[128 * h + r + l] = static_cast<u8>(low | high << 4);
      }
    }
  }
  std::memcpy(o.codes, codes, sizeof(codes));
}

// d | scales_h (u16, 2 bits per group) | scales_l[4] (a nibble per group) | qs[128], packed as the form.
void iq4_xs(const u8* b, const Out& o) {
  copy_f16(b, o.d);
  const int scales_h = b[2] | b[3] << 8;
  for (int g = 0; g < 8; ++g) {
    const int low = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F, high = (scales_h >> (2 * g)) & 3;
    o.sub_scales[g] = static_cast<u8>((low | high << 4) - 32);
  }
  std::memcpy(o.codes, b + 8, 128);
}

struct TypeEntry {
  BlockType type;
  BlockLayout layout;
  BlockFn fn;  // nullptr: a float type, copied as it is
};

// codes, d, sub_scales, mins, sub_mins bytes per block (docs/forms.md's table).
constexpr PlaneBytes planes(std::size_t codes, std::size_t d, std::size_t sub_scales = 0, std::size_t mins = 0,
                            std::size_t sub_mins = 0) {
  PlaneBytes p;
  p.codes = codes;
  p.d = d;
  p.sub_scales = sub_scales;
  p.mins = mins;
  p.sub_mins = sub_mins;
  return p;
}

const TypeEntry kTypes[] = {
    {BlockType::F32, {1, 4, planes(4, 0)}, nullptr},
    {BlockType::F16, {1, 2, planes(2, 0)}, nullptr},
    {BlockType::BF16, {1, 2, planes(2, 0)}, nullptr},
    {BlockType::Q8_0, {32, 34, planes(32, 2)}, q8_0},
    {BlockType::Q4_0, {32, 18, planes(16, 2)}, q4_0},
    {BlockType::IQ4_NL, {32, 18, planes(16, 2)}, q4_0},
    {BlockType::Q4_1, {32, 20, planes(16, 2, 0, 2)}, q4_1},
    {BlockType::Q5_0, {32, 22, planes(32, 2)}, q5_0},
    {BlockType::Q5_1, {32, 24, planes(32, 2, 0, 2)}, q5_1},
    {BlockType::MXFP4, {32, 17, planes(16, 4)}, mxfp4},
    {BlockType::Q2_K, {256, 84, planes(64, 2, 16, 2, 16)}, q2_k},
    {BlockType::Q3_K, {256, 110, planes(256, 2, 16)}, q3_k},
    {BlockType::Q4_K, {256, 144, planes(128, 2, 8, 2, 8)}, q4_k},
    {BlockType::Q5_K, {256, 176, planes(256, 2, 8, 2, 8)}, q5_k},
    {BlockType::Q6_K, {256, 210, planes(256, 2, 16)}, q6_k},
    {BlockType::IQ4_XS, {256, 136, planes(128, 2, 8)}, iq4_xs},
    {BlockType::TQ1_0, {256, 54, planes(64, 2, 8)}, tq1_0},
    {BlockType::TQ2_0, {256, 66, planes(64, 2, 8)}, tq2_0},
};

const TypeEntry* find(int type) {
  for (const TypeEntry& e : kTypes) {
    if (static_cast<int>(e.type) == type) return &e;
  }
  return nullptr;
}

}  // namespace

bool block_type_supported(int type) { return find(type) != nullptr; }

BlockLayout block_layout(BlockType type, const char* what) {
  const TypeEntry* e = find(static_cast<int>(type));
  STRATA_EXPECTS(e != nullptr, InvalidArgument,
                 std::string(what) + ": ggml type " + std::to_string(static_cast<int>(type)) +
                     " is not one the disk tier repacks (the lattice i-quants are not yet)");
  return e->layout;
}

void repack_blocks(BlockType type, const std::uint8_t* src, std::int64_t first, std::int64_t count,
                   const PlaneTargets& dst) {
  const TypeEntry& e = *find(static_cast<int>(type));  // the caller took its layout: the type is known
  const BlockLayout& l = e.layout;
  const auto at = [first](std::uint8_t* plane, std::size_t per_block) -> std::uint8_t* {
    return plane != nullptr ? plane + first * static_cast<std::int64_t>(per_block) : nullptr;
  };
  src += first * l.bytes;
  if (e.fn == nullptr) {  // a float type: its code plane is its blocks as they are
    std::memcpy(at(dst.codes, l.planes.codes), src, static_cast<std::size_t>(count) * l.bytes);
    return;
  }
  Out o{at(dst.codes, l.planes.codes), at(dst.d, l.planes.d), at(dst.sub_scales, l.planes.sub_scales),
        at(dst.mins, l.planes.mins), at(dst.sub_mins, l.planes.sub_mins)};
  for (std::int64_t i = 0; i < count; ++i, src += l.bytes) {
    e.fn(src, o);
    o.codes += l.planes.codes;
    o.d += l.planes.d;
    if (o.sub_scales) o.sub_scales += l.planes.sub_scales;
    if (o.mins) o.mins += l.planes.mins;
    if (o.sub_mins) o.sub_mins += l.planes.sub_mins;
  }
}

}  // namespace strata::cpu
