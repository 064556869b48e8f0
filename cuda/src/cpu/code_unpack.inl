// unpack_codes<K>: the docs/forms.md code packing of one 32-element block -> 32 bytes in element order;
// unpack_pair: two 4-bit blocks at once; codebook_table: a codebook form's 16 values.
// Included inside each ISA file's anonymous namespace (see row_dot.inl for why).

// Unpacks one 32-element block of codes (docs/forms.md packing) into 32 bytes in element order.
template <CodeKind K>
inline __m256i unpack_codes(const uint8_t* codes) {
  if constexpr (K == CodeKind::k8 || K == CodeKind::k8Wide) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  } else if constexpr (K == CodeKind::k2) {
    uint64_t packed;
    std::memcpy(&packed, codes, sizeof(packed));
    // 64-bit lane i holds the packed bytes shifted right by 2i: its bytes' low 2 bits are codes 8i..8i+7.
    const __m256i shifted = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<long long>(packed)),
                                              _mm256_set_epi64x(6, 4, 2, 0));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x03));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(packed, mask);                     // codes 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);  // codes 16..31
    return _mm256_set_m128i(hi, lo);
  }
}

// Two consecutive 4-bit blocks b, b + 1 (32 bytes of codes) in one load: lo holds codes 0..15 of b, then of
// b + 1; hi codes 16..31 of b, then of b + 1. Half the unpacking of two unpack_codes calls, and no lane
// insert: the x operands are permuted to match instead (row_dot.inl, add_pair), once for every row of a pass.
struct CodePair {
  __m256i lo, hi;
};

inline CodePair unpack_pair(const uint8_t* codes) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(packed, mask), _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask)};
}

// The 16 values of a codebook form's table (never called for Codebook::None, which has none).
inline __m128i codebook_table(const QuantForm& f) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook_values(f.codebook)));
}
