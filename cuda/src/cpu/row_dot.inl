// The body of the row-dot kernels, included by dot_avx2.cpp and dot_avx512.cpp inside an anonymous
// namespace (each copy compiled with its own ISA flags: no inline function may be shared between them, or
// the linker could hand the AVX2 machine the AVX-512 copy). The includer defines `IntDot`, built from a
// QuantForm (its codebook table and code bias as codes_dot() wants them):
//   using XBlock = ...;  32 bytes of x as codes_dot() takes them
//   template <CodeKind K, bool Biased> XBlock x_operand(__m256i xq) const;
//     made once for every weight row of a pass, with whatever of the product depends on x alone.
//   template <CodeKind K, bool Biased> __m256i codes_dot(__m256i u, const XBlock& x) const;
//     u: 32 codes as unpack_codes leaves them, x: the 32 activation bytes they meet. 8 int32 lanes,
//     lane i = Σ v * xq over bytes 4i..4i+3, v the weight's signed integer value (docs/forms.md), EXACT: the code
//     bias is removed in the integer domain, never through float group sums, whose cancellation against large
//     biased products costs accuracy. Biased is false only for forms with code_bias 0 and no codebook.
//   struct XPair;  template <CodeKind K, bool Biased> XPair pair_operand(__m256i xq_lo, __m256i xq_hi) const;
//   template <CodeKind K, bool Biased> __m256i pair_dot(__m256i u_lo, __m256i u_hi, const XPair& x) const;
//     4-bit codes two blocks at a time (add_pair): lane i = codes_dot(u_lo, x_lo)[i] + codes_dot(u_hi, x_hi)[i],
//     exact; the pair's x operand made once for every row of a pass.
// Needs <immintrin.h>, <cstring>, <utility>, "dot.hpp" and code_unpack.inl included before.

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The accumulators of a pass, one per row: a value whose lanes every access names by a constant, so that the
// compiler keeps them in registers.
template <int N>
struct RowSums {
  __m256 v[N];
};

// Lanes (a0 + a4 + a2 + a6, b0 + b4 + b2 + b6, a1 + a5 + a3 + a7, b1 + b5 + b3 + b7), each sum as horizontal_sum
// pairs them.
inline __m128 pair_sums(__m256 a, __m256 b) {
  const __m128 qa = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 qb = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  return _mm_add_ps(_mm_unpacklo_ps(qa, qb), _mm_unpackhi_ps(qa, qb));
}

// Lane i = horizontal_sum(s.v[i]) bit for bit, for N = 2 or 4 rows at once: every lane adds the same pairs in
// the same order ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), only transposed across the rows.
template <int N>
inline __m128 horizontal_sums(const RowSums<N>& s) {
  static_assert(N == 2 || N == 4, "two or four rows");
  const __m128 ab = pair_sums(s.v[0], s.v[1]);
  if constexpr (N == 2) {
    return _mm_add_ps(ab, _mm_movehl_ps(ab, ab));
  } else {
    const __m128 cd = pair_sums(s.v[2], s.v[3]);
    return _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab));
  }
}

inline __m256 load_scales8(const uint8_t* d, bool f32) {
  if (f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(d));
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
}

inline float load_scale(const uint8_t* d, bool f32) {
  if (f32) {
    float v;
    std::memcpy(&v, d, sizeof(v));
    return v;
  }
  uint16_t h;
  std::memcpy(&h, d, sizeof(h));
  return _cvtsh_ss(h);
}

inline __m256 int8x8_to_float(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 uint8x8_to_float(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// sc[g] = d_g * dx_b(g) of a form with one scale a group (super == group, no sub-scales): row_scales' first part
// for such forms, and the whole of phase A for the plain ones (no mins: Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4), whose
// kernels call it alone (ScalePlan below) instead of row_scales with its general form's branches and set-up,
// which on a down row (16-20 groups) cost as much as a third of the row.
template <int G, bool F32Scales>
inline void plain_scales(const MatrixRows& m, int64_t row, const QuantizedVector& x, float* sc) {
  constexpr int kBytes = F32Scales ? 4 : 2;
  const int64_t n = m.cols / G;
  const uint8_t* d = m.d + row * n * kBytes;
  const float* dxg = G == 16 ? x.dx16 : x.dx;
  int64_t g = 0;
  for (; g + 8 <= n; g += 8) _mm256_storeu_ps(sc + g, _mm256_mul_ps(load_scales8(d + g * kBytes, F32Scales),
                                                                     _mm256_loadu_ps(dxg + g)));
  if (g + 4 <= n) {
    const uint8_t* at = d + g * kBytes;
    const __m128 dg = F32Scales ? _mm_loadu_ps(reinterpret_cast<const float*>(at))
                                : _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
    _mm_storeu_ps(sc + g, _mm_mul_ps(dg, _mm_loadu_ps(dxg + g)));
    g += 4;
  }
  for (; g < n; ++g) sc[g] = load_scale(d + g * kBytes, F32Scales) * dxg[g];
}

// Phase A of a row: sc[g] = d_S * s_g * dx_b(g) for every group g, and the returned offset
// Σ_g mins_S * sm_g * dx_b(g) * Σ_{i in g} xq_i (zero for forms without mins).
template <int G>
float row_scales(const MatrixRows& m, int64_t row, const QuantizedVector& x, float* sc) {
  const QuantForm& f = *m.form;
  const int64_t n_groups = m.cols / G, n_super = m.cols / f.super_size;
  const int scale_bytes = f.scale_f32 ? 4 : 2;
  const uint8_t* d = m.d + row * n_super * scale_bytes;
  const float* dxg = G == 16 ? x.dx16 : x.dx;
  const float* xs = G == 16 ? x.xs16 : x.xs32;
  __m256 off = _mm256_setzero_ps();
  if (!f.has_sub_scales) {  // super == group: one scale (and min) per group
    if (f.scale_f32) plain_scales<G, true>(m, row, x, sc);
    else plain_scales<G, false>(m, row, x, sc);
    if (!f.has_mins) return 0.0f;
    const uint16_t* mins = m.mins + row * n_super;
    int64_t g = 0;
    for (; g + 8 <= n_groups; g += 8) {
      const __m256 mg = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + g)));
      off = _mm256_fmadd_ps(mg, _mm256_loadu_ps(xs + g), off);
    }
    float tail = 0.0f;
    for (; g < n_groups; ++g) tail += _cvtsh_ss(mins[g]) * xs[g];
    return horizontal_sum(off) + tail;
  }
  // super == 256 with sub-scales: 8 or 16 groups per super-block, 8 at a time.
  const int64_t per_super = f.super_size / G;
  const int8_t* sub = m.sub_scales + row * n_groups;
  const uint16_t* mins = f.has_mins ? m.mins + row * n_super : nullptr;
  const uint8_t* sub_mins = f.has_mins ? m.sub_mins + row * n_groups : nullptr;
  for (int64_t s = 0; s < n_super; ++s) {
    const __m256 ds = _mm256_set1_ps(load_scale(d + s * scale_bytes, f.scale_f32));
    const __m256 ms = _mm256_set1_ps(mins ? _cvtsh_ss(mins[s]) : 0.0f);
    for (int64_t g = s * per_super; g < (s + 1) * per_super; g += 8) {
      const __m256 sg = int8x8_to_float(sub + g);
      _mm256_storeu_ps(sc + g, _mm256_mul_ps(_mm256_mul_ps(ds, sg), _mm256_loadu_ps(dxg + g)));
      if (mins) off = _mm256_fmadd_ps(_mm256_mul_ps(ms, uint8x8_to_float(sub_mins + g)), _mm256_loadu_ps(xs + g), off);
    }
  }
  return horizontal_sum(off);
}

// Lanes 0..3 scale sc[i], lanes 4..7 sc[j].
inline __m256 two_scales(const float* sc, int64_t i, int64_t j) {
  return _mm256_set_m128(_mm_broadcast_ss(sc + j), _mm_broadcast_ss(sc + i));
}

// How a kernel makes a row's scales: row_scales for any form, or plain_scales for the plain ones.
enum ScalePlan { kAnyScales, kPlainF16, kPlainF32 };

// The scale of each lane of block b's dot: one group (G == 32), or lanes 0..3 group 2b and 4..7 group 2b+1.
template <int G>
inline __m256 block_scales(const float* sc, int64_t b) {
  if constexpr (G == 32) return _mm256_broadcast_ss(sc + b);
  return two_scales(sc, 2 * b, 2 * b + 1);
}

// Bytes of one 32-element block of codes.
template <CodeKind K>
constexpr int64_t kBlockBytes = K == CodeKind::k2 ? 8 : K == CodeKind::k8 || K == CodeKind::k8Wide ? 32 : 16;

inline __m256i load_x(const int8_t* xq, int64_t b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
}

// acc.v[I] += (block b of row I's codes . x block b) * row I's scales of block b, for each row I of a pass.
// add_block and add_pair are the loop's body: always inlined (out of line, the accumulators go through memory and
// every step pays a call; GCC's own choice varied between a kernel's instantiations).
template <CodeKind K, bool Biased, int G, int N, size_t... I>
[[gnu::always_inline]] inline RowSums<N> add_block(RowSums<N> acc, const IntDot& dot, const uint8_t* const* codes,
                                                   const float* const* sc, const int8_t* xq, int64_t b,
                                                   std::index_sequence<I...>) {
  const typename IntDot::XBlock xb = dot.template x_operand<K, Biased>(load_x(xq, b));
  ((acc.v[I] = _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(dot.template codes_dot<K, Biased>(unpack_codes<K>(codes[I] + b * kBlockBytes<K>), xb)),
        block_scales<G>(sc[I], b), acc.v[I])),
   ...);
  return acc;
}

// 4-bit codes take blocks b and b + 1 together (unpack_pair): lanes 0..3 of each dot are block b's, 4..7 block
// b + 1's, each lane the same elements of its block as in add_block. With one scale a block (G == 32) the lo and
// hi dots add in int32 (exact) before their one conversion; with two (G == 16) the halves are groups of their own.
template <CodeKind K>
constexpr bool kPaired = K == CodeKind::k4 || K == CodeKind::k4Codebook;

// One row's share of add_pair with one scale a block (G == 32): the halves' exact dot in one (pair_dot), one
// conversion.
template <CodeKind K, bool Biased>
[[gnu::always_inline]] inline __m256 pair_term(__m256 acc, const IntDot& dot, const uint8_t* codes, const float* sc,
                                               int64_t b, const typename IntDot::XPair& x) {
  const CodePair u = unpack_pair(codes + b * kBlockBytes<K>);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot.template pair_dot<K, Biased>(u.lo, u.hi, x)), two_scales(sc, b, b + 1),
                         acc);
}

// With two scales a block (G == 16) each half's lanes are groups of their own: a dot and a conversion each.
template <CodeKind K, bool Biased>
[[gnu::always_inline]] inline __m256 pair_term(__m256 acc, const IntDot& dot, const uint8_t* codes, const float* sc,
                                               int64_t b, const typename IntDot::XBlock& x_lo,
                                               const typename IntDot::XBlock& x_hi) {
  const CodePair u = unpack_pair(codes + b * kBlockBytes<K>);
  const __m256i dot_lo = dot.template codes_dot<K, Biased>(u.lo, x_lo);
  const __m256i dot_hi = dot.template codes_dot<K, Biased>(u.hi, x_hi);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_lo), two_scales(sc, 2 * b, 2 * b + 2), acc);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_hi), two_scales(sc, 2 * b + 1, 2 * b + 3), acc);
}

template <CodeKind K, bool Biased, int G, int N, size_t... I>
[[gnu::always_inline]] inline RowSums<N> add_pair(RowSums<N> acc, const IntDot& dot, const uint8_t* const* codes,
                                                  const float* const* sc, const int8_t* xq, int64_t b,
                                                  std::index_sequence<I...>) {
  const __m256i x0 = load_x(xq, b), x1 = load_x(xq, b + 1);
  const __m256i lo = _mm256_permute2x128_si256(x0, x1, 0x20), hi = _mm256_permute2x128_si256(x0, x1, 0x31);
  if constexpr (G == 32) {
    const typename IntDot::XPair x = dot.template pair_operand<K, Biased>(lo, hi);
    ((acc.v[I] = pair_term<K, Biased>(acc.v[I], dot, codes[I], sc[I], b, x)), ...);
  } else {
    const typename IntDot::XBlock x_lo = dot.template x_operand<K, Biased>(lo);
    const typename IntDot::XBlock x_hi = dot.template x_operand<K, Biased>(hi);
    ((acc.v[I] = pair_term<K, Biased>(acc.v[I], dot, codes[I], sc[I], b, x_lo, x_hi)), ...);
  }
  return acc;
}

// acc.v[I] + more.v[I] for each row I of a pass.
template <int N, size_t... I>
inline RowSums<N> add_rows(RowSums<N> acc, const RowSums<N>& more, std::index_sequence<I...>) {
  ((acc.v[I] = _mm256_add_ps(acc.v[I], more.v[I])), ...);
  return acc;
}

// Phase B over rows r .. r + N - 1 in one pass over the blocks: y[i] = scale * (Σ_g sc[g] * Σ_{i in g} v_i xq_i
// + offset) of row r + i. A pass loads each x block once for its rows, and on rows of few blocks (a down
// matrix of 16-20) spreads its fixed costs over them. Each row keeps its own two accumulators (block 2j into
// the first, 2j + 1 into the second; 4-bit codes: the pair 2j, 2j + 1 into the first, an odd count's last block
// into the second) and its own horizontal sum, so a row's result is the same bits whatever
// pass it runs in, N = 1 included.
template <CodeKind K, bool Biased, int G, ScalePlan Plan, int N>
void rows_pass(const MatrixRows& m, int64_t r, const QuantizedVector& x, const IntDot& dot, float scale, float* y) {
  const int64_t n_blocks = m.cols / 32;
  alignas(32) float scales[N][kMaxCols / 16 + 8];
  alignas(16) float offset[4] = {};
  const uint8_t* codes[N];
  const float* sc[N];
  for (int i = 0; i < N; ++i) {
    if constexpr (Plan == kAnyScales) offset[i] = row_scales<G>(m, r + i, x, scales[i]);
    else plain_scales<G, Plan == kPlainF32>(m, r + i, x, scales[i]);
    codes[i] = m.codes + (r + i) * n_blocks * kBlockBytes<K>;
    sc[i] = scales[i];
  }
  constexpr std::make_index_sequence<N> kRows;
  RowSums<N> acc0 = {}, acc1 = {};
  for (int64_t b = 0; b < n_blocks; b += 2) {
    // Software prefetch kPrefetchAhead bytes ahead, a line of each row as the pass enters it: the rows of a
    // work item are one stream, and the hardware prefetcher alone leaves the per-core DRAM bandwidth
    // underused. Spread through the loop, the prefetches stay off the pass's start, where a burst of them
    // queued before the first loads.
    if (b * kBlockBytes<K> % 64 == 0)
      for (int i = 0; i < N; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(codes[i] + b * kBlockBytes<K> + kPrefetchAhead), _MM_HINT_T0);
    if constexpr (kPaired<K>) {
      if (b + 1 < n_blocks) acc0 = add_pair<K, Biased, G, N>(acc0, dot, codes, sc, x.xq, b, kRows);
      else acc1 = add_block<K, Biased, G, N>(acc1, dot, codes, sc, x.xq, b, kRows);  // n_blocks may be odd
    } else {
      acc0 = add_block<K, Biased, G, N>(acc0, dot, codes, sc, x.xq, b, kRows);
      if (b + 1 < n_blocks)  // n_blocks may be odd
        acc1 = add_block<K, Biased, G, N>(acc1, dot, codes, sc, x.xq, b + 1, kRows);
    }
  }
  const RowSums<N> sums = add_rows<N>(acc0, acc1, kRows);
  if constexpr (N == 1) {
    y[0] = scale * (horizontal_sum(sums.v[0]) + offset[0]);
  } else {
    const __m128 v = _mm_mul_ps(_mm_set1_ps(scale), _mm_add_ps(horizontal_sums<N>(sums), _mm_load_ps(offset)));
    if constexpr (N == 4) _mm_storeu_ps(y, v);
    else _mm_storel_pi(reinterpret_cast<__m64*>(y), v);
  }
}

// The row loop: passes of four rows, then two, then one.
template <CodeKind K, bool Biased, int G, ScalePlan Plan = kAnyScales>
void rows_dot(const MatrixRows& m, int64_t row0, int64_t row1, const Activation& activation, float scale, float* y) {
  const IntDot dot(*m.form);
  int64_t r = row0;
  for (; r + 4 <= row1; r += 4) rows_pass<K, Biased, G, Plan, 4>(m, r, activation.q, dot, scale, y + (r - row0));
  if (r + 2 <= row1) {
    rows_pass<K, Biased, G, Plan, 2>(m, r, activation.q, dot, scale, y + (r - row0));
    r += 2;
  }
  if (r < row1) rows_pass<K, Biased, G, Plan, 1>(m, r, activation.q, dot, scale, y + (r - row0));
}

template <CodeKind K, bool Biased>
RowsKernel pick_group(const QuantForm& f) {
  if (!f.has_sub_scales && !f.has_mins && f.group_size == 32)
    return f.scale_f32 ? &rows_dot<K, Biased, 32, kPlainF32> : &rows_dot<K, Biased, 32, kPlainF16>;
  return f.group_size == 16 ? &rows_dot<K, Biased, 16> : &rows_dot<K, Biased, 32>;
}

template <CodeKind K>
RowsKernel pick_bias(const QuantForm& f) {
  return f.code_bias != 0 ? pick_group<K, true>(f) : pick_group<K, false>(f);
}

RowsKernel pick_kernel(const QuantForm& f) {
  if (f.code_bits == 2) return pick_bias<CodeKind::k2>(f);
  // A symmetric form's codes stay below twice its bias, an unbiased one's below 32 (docs/forms.md).
  if (f.code_bits == 8) return f.code_bias > 64 ? pick_bias<CodeKind::k8Wide>(f) : pick_bias<CodeKind::k8>(f);
  return f.codebook != Codebook::None ? pick_group<CodeKind::k4Codebook, true>(f) : pick_bias<CodeKind::k4>(f);
}
