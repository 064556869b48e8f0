// IntDot for AVX-512 VNNI (256-bit vectors, AVX512VL), as row_dot.inl wants it: vpdpbusd multiplies u8 codes
// by s8 activations and sums each four products into int32 without saturation. The code bias (and, for codebook
// forms, the +128 that makes the table unsigned) comes off in int32: each dot starts from -Σ bias xq, a vpdpbusd
// of the bias made once per x block for all the rows of a pass.
// Included inside an anonymous namespace after code_unpack.inl, by dot_avx512.cpp (the instruction) and by the
// check library's vnni_emulated.cpp (vpdpbusd emulated on AVX2, so that CI checks this logic too): it names the
// instruction only as _mm256_dpbusd_epi32.

struct IntDot {
  // A dot starts from -Σ bias xq, which depends on x alone: a pass makes it once per block for all its rows, and
  // vpdpbusd accumulates Σ u xq onto it, so Σ (u - bias) xq (exact in int32) costs no subtraction a row.
  struct XBlock {
    __m256i xq, start;
  };

  // The codebook path looks up codebook[c] + 128 (unsigned), so its bias is 128.
  explicit IntDot(const QuantForm& f)
      : lut_(f.codebook == Codebook::None ? _mm256_setzero_si256() : _mm256_broadcastsi128_si256(offset_table(f))),
        bias_(_mm256_set1_epi8(static_cast<char>(f.codebook != Codebook::None ? 128 : f.code_bias))) {}

  // codebook[c] + 128 for each code c.
  static __m128i offset_table(const QuantForm& f) {
    return _mm_xor_si128(codebook_table(f), _mm_set1_epi8(static_cast<char>(0x80)));
  }

  template <CodeKind K, bool Biased>
  XBlock x_operand(__m256i xq) const {
    if constexpr (!Biased) return {xq, _mm256_setzero_si256()};
    return {xq, minus_bias_dot(_mm256_setzero_si256(), xq)};
  }

  template <CodeKind K, bool Biased>
  __m256i codes_dot(__m256i u, const XBlock& x) const {
    if constexpr (K == CodeKind::k4Codebook) u = _mm256_shuffle_epi8(lut_, u);
    return _mm256_dpbusd_epi32(x.start, u, x.xq);
  }

  // The two halves of a block pair together, from one start: -Σ bias xq over both.
  struct XPair {
    __m256i lo, hi, start;
  };

  template <CodeKind K, bool Biased>
  XPair pair_operand(__m256i xq_lo, __m256i xq_hi) const {
    if constexpr (!Biased) return {xq_lo, xq_hi, _mm256_setzero_si256()};
    return {xq_lo, xq_hi, minus_bias_dot(_mm256_dpbusd_epi32(_mm256_setzero_si256(), bias_, xq_lo), xq_hi)};
  }

  // codes_dot(u_lo, lo) + codes_dot(u_hi, hi) lane by lane: the second vpdpbusd accumulates onto the first.
  template <CodeKind K, bool Biased>
  __m256i pair_dot(__m256i u_lo, __m256i u_hi, const XPair& x) const {
    if constexpr (K == CodeKind::k4Codebook) {
      u_lo = _mm256_shuffle_epi8(lut_, u_lo);
      u_hi = _mm256_shuffle_epi8(lut_, u_hi);
    }
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(x.start, u_lo, x.lo), u_hi, x.hi);
  }

 private:
  // -(partial + Σ bias xq).
  __m256i minus_bias_dot(__m256i partial, __m256i xq) const {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(partial, bias_, xq));
  }

  __m256i lut_, bias_;
};
