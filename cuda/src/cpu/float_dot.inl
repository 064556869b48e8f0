// The body of the float row-dot kernels (float forms, docs/forms.md: x is float32), included by
// float_dot_avx2.cpp and float_dot_avx512.cpp inside an anonymous namespace, for the reason row_dot.inl gives:
// each copy is compiled with its own ISA flags, so no inline function may be shared between them.
// The includer defines `FloatVec`, one vector of float32 lanes:
//   using V = ...;  static constexpr int64_t kLanes;  (a divisor of 32: rows are whole 32-element blocks)
//   template <FloatKind K> static V weights(const uint8_t* p);  kLanes elements of kind K at p, as float32
//   static V load(const float* p);  static V zero();  static V add(V, V);
//   static V fma(V a, V b, V c);    a * b + c, one rounding
//   static float sum(V);
// Needs <immintrin.h> and "dot.hpp" included before.
//
// Every weight widens to float32 exactly (bf16 by a 16-bit shift, f16 by vcvtph2ps) and meets x in a
// float32 FMA. The packed bf16 dot products (AVX512-BF16 vdpbf16ps, AMX) were not chosen: they round x to
// bf16 (8 significant bits, a relative error of up to 2^-9 per element, where the contract says float32),
// and this GEMV is bandwidth-bound: even the widening path spends about one FMA per 32 bytes of weights read,
// far below what a core issues while it waits on DRAM.

// y[r - row0] = scale * (W[r] . x). Four accumulators of kLanes lanes each: independent FMA chains hide the
// FMA latency, and every row is summed in 4 * kLanes partial sums (>= 32), so each lane's float32 chain is
// at most cols / 32 FMAs long (the tolerance of tests/pool/test_pool.py rests on that).
template <FloatKind K>
void float_rows_dot(const MatrixRows& m, int64_t row0, int64_t row1, const Activation& activation, float scale,
                    float* y) {
  using V = FloatVec::V;
  constexpr int64_t kLanes = FloatVec::kLanes;
  constexpr int64_t kElement = static_cast<int64_t>(float_kind_bytes(K));
  constexpr int64_t kStep = 4 * kLanes;  // elements per step of the four accumulators
  static_assert(kStep * kElement % 64 == 0, "a step covers whole cache lines");
  static_assert(kStep == 32 || (kStep == 64 && kLanes == 16), "rows are whole 32-element blocks: see the tail");
  const float* x = activation.f32;
  const int64_t cols = m.cols;
  for (int64_t r = row0; r < row1; ++r) {
    const uint8_t* w = m.codes + r * cols * kElement;
    // acc + W[r][at .. at + kLanes) * x[at .. at + kLanes)
    auto fma_at = [w, x](int64_t at, V acc) {
      return FloatVec::fma(FloatVec::weights<K>(w + at * kElement), FloatVec::load(x + at), acc);
    };
    V acc0 = FloatVec::zero(), acc1 = FloatVec::zero(), acc2 = FloatVec::zero(), acc3 = FloatVec::zero();
    int64_t i = 0;
    for (; i + kStep <= cols; i += kStep) {
      // Software prefetch kPrefetchAhead bytes ahead, one line at a time as the step reads its lines (the
      // quantized kernels' idea: a work item's rows are one stream the hardware prefetcher alone underfeeds).
      for (int64_t line = 0; line < kStep * kElement; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * kElement + line + kPrefetchAhead), _MM_HINT_T0);
      acc0 = fma_at(i, acc0);
      acc1 = fma_at(i + kLanes, acc1);
      acc2 = fma_at(i + 2 * kLanes, acc2);
      acc3 = fma_at(i + 3 * kLanes, acc3);
    }
    if constexpr (kStep == 64) {  // cols is a multiple of 32: one 32-element block may be left, two vectors
      if (i < cols) {
        acc0 = fma_at(i, acc0);
        acc1 = fma_at(i + kLanes, acc1);
      }
    }
    y[r - row0] = scale * FloatVec::sum(FloatVec::add(FloatVec::add(acc0, acc1), FloatVec::add(acc2, acc3)));
  }
}

RowsKernel pick_float_kernel(FloatKind kind) {
  switch (kind) {
    case FloatKind::F16: return &float_rows_dot<FloatKind::F16>;
    case FloatKind::BF16: return &float_rows_dot<FloatKind::BF16>;
    default: return &float_rows_dot<FloatKind::F32>;
  }
}
