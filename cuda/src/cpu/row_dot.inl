// The body of the row-dot kernels, included by dot_avx2.cpp and dot_avx512.cpp inside an anonymous
// namespace (each copy compiled with its own ISA flags: no inline function may be shared between them, or
// the linker could hand the AVX2 machine the AVX-512 copy). The includer defines `IntDot`:
//   template <CodeKind K, bool Biased>
//   static __m256i IntDot::block(const uint8_t* codes, const int8_t* xq, __m256i lut, __m256i bias);
//     8 int32 lanes, lane i = Σ v * xq over elements 4i..4i+3 of the 32-element block, v the weight's
//     signed integer value (docs/forms.md), EXACT: the code bias is removed in the integer domain, never
//     through float group sums, whose cancellation against large biased products costs accuracy.
//     Biased is false only for forms with code_bias 0 and no codebook.
//   static __m256i IntDot::lut(const QuantForm&)   the codebook table as block() wants it.
//   static __m256i IntDot::bias(const QuantForm&)  the bias as block() wants it.
// Needs <immintrin.h>, <cstring>, "dot.hpp" and code_unpack.inl included before.

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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
    const uint16_t* mins = f.has_mins ? m.mins + row * n_super : nullptr;
    int64_t g = 0;
    for (; g + 8 <= n_groups; g += 8) {
      const __m256 dg = load_scales8(d + g * scale_bytes, f.scale_f32);
      _mm256_storeu_ps(sc + g, _mm256_mul_ps(dg, _mm256_loadu_ps(dxg + g)));
      if (mins) {
        const __m256 mg = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + g)));
        off = _mm256_fmadd_ps(mg, _mm256_loadu_ps(xs + g), off);
      }
    }
    float tail = 0.0f;
    for (; g < n_groups; ++g) {
      sc[g] = load_scale(d + g * scale_bytes, f.scale_f32) * dxg[g];
      if (mins) tail += _cvtsh_ss(mins[g]) * xs[g];
    }
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

// Phase B and the row loop: y[r - row0] = scale * (Σ_g sc[g] * Σ_{i in g} v_i xq_i + offset).
template <CodeKind K, bool Biased, int G>
void rows_dot(const MatrixRows& m, int64_t row0, int64_t row1, const Activation& activation, float scale, float* y) {
  const QuantizedVector& x = activation.q;
  alignas(32) float sc[kMaxCols / 16 + 8];
  const QuantForm& f = *m.form;
  const int64_t n_blocks = m.cols / 32;
  const int64_t block_bytes = 32 * f.code_bits / 8;
  const __m256i lut = IntDot::lut(f), bias = IntDot::bias(f);
  for (int64_t r = row0; r < row1; ++r) {
    const float offset = row_scales<G>(m, r, x, sc);
    const uint8_t* codes = m.codes + r * n_blocks * block_bytes;
    // Software prefetch kPrefetchAhead bytes ahead: the rows of a work item are one stream, and the
    // hardware prefetcher alone leaves the per-core DRAM bandwidth underused.
    for (int64_t p = 0; p < n_blocks * block_bytes; p += 64)
      _mm_prefetch(reinterpret_cast<const char*>(codes + p + kPrefetchAhead), _MM_HINT_T0);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; b += 2) {
      // Two blocks per step into two accumulators (n_blocks may be odd: the second is guarded).
      for (int half = 0; half < 2 && b + half < n_blocks; ++half) {
        const int64_t bb = b + half;
        const __m256i dot = IntDot::block<K, Biased>(codes + bb * block_bytes, x.xq + bb * 32, lut, bias);
        __m256 s;
        if constexpr (G == 32) {
          s = _mm256_broadcast_ss(sc + bb);
        } else {  // lanes 0..3 are group 2bb, lanes 4..7 group 2bb+1
          s = _mm256_set_m128(_mm_broadcast_ss(sc + 2 * bb + 1), _mm_broadcast_ss(sc + 2 * bb));
        }
        if (half == 0) acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc0);
        else acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc1);
      }
    }
    y[r - row0] = scale * (horizontal_sum(_mm256_add_ps(acc0, acc1)) + offset);
  }
}

template <CodeKind K, bool Biased>
RowsKernel pick_group(const QuantForm& f) {
  return f.group_size == 16 ? &rows_dot<K, Biased, 16> : &rows_dot<K, Biased, 32>;
}

template <CodeKind K>
RowsKernel pick_bias(const QuantForm& f) {
  return f.code_bias != 0 ? pick_group<K, true>(f) : pick_group<K, false>(f);
}

RowsKernel pick_kernel(const QuantForm& f) {
  if (f.code_bits == 2) return pick_bias<CodeKind::k2>(f);
  if (f.code_bits == 8) return pick_bias<CodeKind::k8>(f);
  return f.codebook != Codebook::None ? pick_group<CodeKind::k4Codebook, true>(f) : pick_bias<CodeKind::k4>(f);
}
