#include "hc_read.cuh"

#include <cstddef>
#include <cstdint>

#include "gemv_float_rows.cuh"
#include "gemv_quant_rows.cuh"
#include "hc_gates.cuh"
#include "launch.cuh"
#include "q8_32_blocks.cuh"
#include "quant_shapes.cuh"
#include "reduce.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;      // hc_read_up_mix: one column of x per warp, one q8_32 block per CTA
constexpr int kDownRows = 4;               // hc_read_down: rows per CTA, each walked by 8 warps (~80 CTAs of 324
constexpr int kWarpsPerRow = kWarps / kDownRows;  // rows: few enough that staging Hn in each costs little L2)
constexpr int kMaxStreams = 32;            // hc_read_up_mix splits a warp's lanes among the streams' rows
constexpr int kStageBatch = 8;             // blocks whose loads a warp issues before it uses any
constexpr int kLine = 128;                 // bytes one L2 prefetch asks for

// The form of a launch's weight rows: float (gemv_float_rows.cuh's FloatRows, always its 16-byte path:
// weight_fits asks for aligned rows and the staged activation is aligned) or quantized (shape S of
// quant_shapes.cuh).
template <class S>
struct QuantRows {
  using Shape = S;
};
template <class F>
constexpr bool kQuantRows = false;
template <class S>
constexpr bool kQuantRows<QuantRows<S>> = true;

// A weight as a kernel argument: its planes and the runtime parts of a quantized form.
struct Matrix {
  const void* data = nullptr;
  QuantPlanes planes;
  int code_bias = 0;
  ValueTable book = {};
};

Matrix matrix(const WeightMatrix& w) {
  return {w.data, w.planes, w.form.code_bias, value_table(w.is_float ? nullptr : codebook_values(w.form.codebook))};
}

// Shared-memory bytes of an activation of `cols` floats as rows of the weight's form read it.
std::size_t staged_bytes(const WeightMatrix& w, int cols) {
  return w.is_float ? sizeof(float) * cols : cols + (sizeof(float) + sizeof(std::int32_t)) * (cols / kCodeBlock);
}

// The activation in dynamic shared memory: float32 x, or q8_32 xq, dx, sums (16-byte aligned: cols % 32 == 0).
struct Staged {
  float* x;
  std::int8_t* xq;
  float* dx;
  std::int32_t* sums;
};

__device__ __forceinline__ Staged carve(unsigned char* smem, int cols) {
  const int blocks = cols / kCodeBlock;
  return {reinterpret_cast<float*>(smem), reinterpret_cast<std::int8_t*>(smem), reinterpret_cast<float*>(smem + cols),
          reinterpret_cast<std::int32_t*>(smem + cols + sizeof(float) * blocks)};
}

// value(i) for i < cols into s as rows of form F read it, one 32-column block per warp at a time with
// kStageBatch blocks' loads in flight; q8_32 through quantize_q8_32's own device code (q8_32_blocks.cuh). Ends
// in a CTA barrier.
template <class F, class Value>
__device__ __forceinline__ void stage(const Staged& s, int cols, const Value& value) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, blocks = cols / kCodeBlock;
  for (int first = warp; first < blocks; first += kWarps * kStageBatch) {
    float v[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int b = first + u * kWarps;
      v[u] = b < blocks ? value(b * kCodeBlock + lane) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int b = first + u * kWarps;
      if (b >= blocks) break;  // alike for the whole warp: store_q8_32's shuffles see every lane
      if constexpr (kQuantRows<F>) store_q8_32(v[u], Q8Blocks{s.xq, s.dx, s.sums}, b * kCodeBlock + lane);
      else s.x[b * kCodeBlock + lane] = v[u];
    }
  }
  __syncthreads();
}

// This slot's part of row `row`'s dot with the staged activation (the caller sums the slots).
template <class F>
__device__ __forceinline__ float row_dot(const Matrix& m, long row, int cols, int slot, int slots, const Staged& s) {
  if constexpr (kQuantRows<F>) {
    return quant_row_partial<typename F::Shape>(m.planes, row, true, cols, m.code_bias, m.book,
                                                SharedQ8{s.xq, s.dx, s.sums}, slot, slots);
  } else {
    using T = typename F::Element;
    return float_row_partial<T, F::kVec>(static_cast<const T*>(m.data) + row * cols, cols, SharedF32{s.x}, slot,
                                         slots);
  }
}

__device__ __forceinline__ void prefetch(const void* p, long bytes, int slot, int slots) {
  const char* at = static_cast<const char*>(p);
  for (long off = static_cast<long>(slot) * kLine; off < bytes; off += static_cast<long>(slots) * kLine)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at + off));
}

// Asks L2 for row `row`'s bytes (a float form's data; a quantized form's codes and scales, nearly all of it)
// so that they stream in from HBM while the CTA stages its activation.
template <class F>
__device__ __forceinline__ void prefetch_row(const Matrix& m, long row, int cols, int slot, int slots) {
  if constexpr (kQuantRows<F>) {
    using S = typename F::Shape;
    const long code_bytes = static_cast<long>(cols) * S::kBits / 8;
    const long d_bytes = static_cast<long>(cols / S::kSuper) * (S::kScaleF32 ? 4 : 2);
    prefetch(m.planes.codes + row * code_bytes, code_bytes, slot, slots);
    prefetch(static_cast<const char*>(m.planes.d) + row * d_bytes, d_bytes, slot, slots);
  } else {
    const long bytes = static_cast<long>(cols) * sizeof(typename F::Element);
    prefetch(static_cast<const char*>(m.data) + row * bytes, bytes, slot, slots);
  }
}

// One weight's rows of a hc_read_down launch and where their gated products go: out[r] = post act(dot / hc).
struct DownPart {
  Matrix m;
  int rows = 0;
  float* out = nullptr;
  Activation act = Activation::Silu;
  float post = 1.0f;
};

struct DownArgs {
  const float* streams;
  const float* norm;
  int hc, n;
  float eps;
  DownPart part[2];  // the launch's rows: part[0]'s, then part[1]'s
  float* rms;        // null: another launch writes it
};

// Each stream's inverse RMS into inv_rms[hc], reduced in the same order by every CTA (so every CTA's Hn is the
// one hc_read_up_mix rebuilds from rms). A warp walks its blocks in order, so it meets each stream once.
__device__ __forceinline__ void inverse_rms(const DownArgs& a, float* inv_rms) {
  __shared__ float partial[kMaxStreams][kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, blocks = a.hc * a.n / kCodeBlock;
  if (lane < a.hc) partial[lane][warp] = 0.0f;
  __syncwarp();
  float acc = 0.0f;
  int stream = warp * kCodeBlock / a.n;
  for (int first = warp; first < blocks; first += kWarps * kStageBatch) {
    float v[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int b = first + u * kWarps;
      v[u] = b < blocks ? a.streams[b * kCodeBlock + lane] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int b = first + u * kWarps;
      if (b >= blocks) break;
      const int k = b * kCodeBlock / a.n;  // a block lies in one stream: n % 32 == 0
      if (k != stream) {
        acc = warp_sum(acc);
        if (lane == 0) partial[stream][warp] = acc;
        acc = 0.0f;
        stream = k;
      }
      acc = fmaf(v[u], v[u], acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0 && stream < a.hc) partial[stream][warp] = acc;
  __syncthreads();
  if (warp < a.hc) {
    const float sum_sq = warp_sum(partial[warp][lane]);
    if (lane == 0) inv_rms[warp] = rsqrtf(sum_sq / static_cast<float>(a.n) + a.eps);
  }
  __syncthreads();
}

template <class F>
__global__ void __launch_bounds__(kThreads) hc_read_down_kernel(DownArgs a) {
  await_producers();
  release_consumers();
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float inv_rms[kMaxStreams];
  __shared__ float row_partial[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, width = a.hc * a.n;
  const int row = blockIdx.x * kDownRows + warp / kWarpsPerRow;  // in the launch: part[0]'s rows, then part[1]'s
  const bool first_part = row < a.part[0].rows;
  const DownPart& part = a.part[first_part ? 0 : 1];
  const int part_row = first_part ? row : row - a.part[0].rows;
  const bool live = part_row < part.rows;
  const int slot = warp % kWarpsPerRow * 32 + lane, slots = kWarpsPerRow * 32;
  if (live) prefetch_row<F>(part.m, part_row, width, slot, slots);

  inverse_rms(a, inv_rms);
  if (a.rms && blockIdx.x == 0 && threadIdx.x < a.hc) a.rms[threadIdx.x] = inv_rms[threadIdx.x];
  const Staged s = carve(smem, width);
  // Hn as norm.cu's grouped rms_norm computes it; the streams are in L1 since inverse_rms read them.
  stage<F>(s, width, [&](int i) { return a.streams[i] * inv_rms[i / a.n] * a.norm[i]; });

  float acc = live ? row_dot<F>(part.m, part_row, width, slot, slots, s) : 0.0f;
  acc = warp_sum(acc);
  if (lane == 0) row_partial[warp] = acc;
  __syncthreads();
  if (live && lane == 0 && warp % kWarpsPerRow == 0) {
    float dot = 0.0f;
    for (int w = 0; w < kWarpsPerRow; ++w) dot += row_partial[warp + w];
    part.out[part_row] = hc_activation(dot, part.act, 1.0f / static_cast<float>(a.hc), part.post);
  }
}

struct UpArgs {
  const float* streams;
  const float* norm;
  const float* rms;
  const float* low;
  int hc, n, rank;
  Matrix up;
  float* x;
  Q8Blocks x_q8;  // none: x's readers take its floats
};

// CTA c: columns 32c .. 32c + 31 of x, warp w column 32c + w, its lanes split among the hc rows k n + column of
// W_up; then the CTA's 32 x as one q8_32 block where x_q8 asks for it.
template <class F>
__global__ void __launch_bounds__(kThreads) hc_read_up_mix_kernel(UpArgs a) {
  await_producers();
  release_consumers();
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float block_x[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int column = blockIdx.x * kWarps + warp;
  const int lanes = 32 / a.hc, k = lane / lanes, slot = lane % lanes;
  const long row = static_cast<long>(k) * a.n + column;
  prefetch_row<F>(a.up, row, a.rank, slot, lanes);
  const Staged s = carve(smem, a.rank);
  stage<F>(s, a.rank, [&](int i) { return a.low[i]; });  // as project() would quantize lo

  float up = row_dot<F>(a.up, row, a.rank, slot, lanes, s);
  for (int offset = lanes / 2; offset > 0; offset >>= 1) up += __shfl_xor_sync(0xffffffffu, up, offset);
  const float normed = a.streams[row] * a.rms[k] * a.norm[row];
  float sum = 0.0f;  // hc_mix's sum, stream by stream, from each stream's first lane
  for (int j = 0; j < a.hc; ++j) {
    sum = hc_mix_term(__shfl_sync(0xffffffffu, up, j * lanes), __shfl_sync(0xffffffffu, normed, j * lanes), sum);
  }
  const float x = sum / static_cast<float>(a.hc);
  if (lane == 0) {
    a.x[column] = x;
    block_x[warp] = x;
  }
  __syncthreads();
  if (warp == 0) store_q8_32(block_x[lane], a.x_q8, static_cast<long>(blockIdx.x) * kWarps + lane);
}

// Calls visit(F{}) for the form F of `w`; false where the GEMVs read no such form.
template <class Visit>
bool visit_form(const WeightMatrix& w, Visit&& visit) {
  if (w.is_float) {
    auto wide = [&](auto element) {
      using T = decltype(element);
      visit(FloatRows<T, 16 / sizeof(T)>{});
      return true;
    };
    switch (w.kind) {
      case FloatKind::F32: return wide(float{});
      case FloatKind::F16: return wide(__half{});
      case FloatKind::BF16: return wide(__nv_bfloat16{});
    }
    return false;
  }
  return KnownShapes::visit(w.form, [&](auto shape) { visit(QuantRows<decltype(shape)>{}); });
}

// A weight of `cols` columns the kernels take: a known form, aligned planes, an activation that fits.
bool weight_fits(const WeightMatrix& w, int cols) {
  if (w.is_float) {
    const bool known = w.kind == FloatKind::F32 || w.kind == FloatKind::F16 || w.kind == FloatKind::BF16;
    return known && reinterpret_cast<std::uintptr_t>(w.data) % 16 == 0 && staged_bytes(w, cols) <= kHcStagedBytes;
  }
  const unsigned alignment = w.form.code_bits == 2 ? 8u : 16u;
  return KnownShapes::contains(w.form) && cols % w.form.super_size == 0 &&
         reinterpret_cast<std::uintptr_t>(w.planes.codes) % alignment == 0 && staged_bytes(w, cols) <= kHcStagedBytes;
}

bool shape_fits(const HcReadShape& s) {
  return s.streams >= 1 && s.streams <= kMaxStreams && kMaxStreams % s.streams == 0 && s.n > 0 &&
         s.n % kCodeBlock == 0 && s.rank > 0 && s.rank % kCodeBlock == 0 && s.eps >= 0.0f;
}

bool same_form(const WeightMatrix& a, const WeightMatrix& b) {
  if (a.is_float || b.is_float) return a.is_float == b.is_float && a.kind == b.kind;
  const QuantForm &f = a.form, &g = b.form;
  return f.code_bits == g.code_bits && f.code_bias == g.code_bias && f.codebook == g.codebook &&
         f.group_size == g.group_size && f.super_size == g.super_size && f.scale_f32 == g.scale_f32 &&
         f.has_sub_scales == g.has_sub_scales && f.has_mins == g.has_mins;
}

// One hc_read_down launch over args' parts, all of `w`'s form.
cudaError_t launch_down(const WeightMatrix& w, DownArgs args, cudaStream_t stream) {
  const int rows = args.part[0].rows + args.part[1].rows;
  const unsigned grid = static_cast<unsigned>((rows + kDownRows - 1) / kDownRows);
  const std::size_t bytes = staged_bytes(w, args.hc * args.n);
  cudaError_t status = cudaSuccess;
  visit_form(w, [&](auto form) {
    status = launch(hc_read_down_kernel<decltype(form)>, grid, kThreads, bytes, stream, args);
  });
  return status;
}

}  // namespace

bool hc_read_fusable(const HcReadShape& shape, const WeightMatrix& down, const WeightMatrix& up,
                     const WeightMatrix* inject) {
  if (!shape_fits(shape)) return false;
  const int width = shape.streams * shape.n;
  return weight_fits(down, width) && weight_fits(up, shape.rank) && (!inject || weight_fits(*inject, width));
}

cudaError_t hc_read_down(const HcReadShape& shape, const float* streams, const float* norm, const WeightMatrix& down,
                         const WeightMatrix* inject, float* low, float* inj, float* rms, cudaStream_t stream) {
  const int width = shape.streams * shape.n;
  if (!shape_fits(shape) || !weight_fits(down, width) || (inject && (!inj || !weight_fits(*inject, width))))
    return cudaErrorInvalidValue;
  DownArgs args{streams, norm, shape.streams, shape.n, shape.eps, {}, rms};
  args.part[0] = {matrix(down), shape.rank, low, Activation::Silu, 1.0f};
  if (!inject) return launch_down(down, args, stream);
  const DownPart injection{matrix(*inject), shape.streams, inj, Activation::Sigmoid, 2.0f};
  if (same_form(down, *inject)) {
    args.part[1] = injection;
    return launch_down(down, args, stream);
  }
  const cudaError_t first = launch_down(down, args, stream);
  if (first != cudaSuccess) return first;
  args.part[0] = injection;
  args.rms = nullptr;
  return launch_down(*inject, args, stream);
}

cudaError_t hc_read_up_mix(const HcReadShape& shape, const float* streams, const float* norm, const float* rms,
                           const float* low, const WeightMatrix& up, float* x, const Q8Blocks& x_q8,
                           cudaStream_t stream) {
  if (!shape_fits(shape) || !weight_fits(up, shape.rank)) return cudaErrorInvalidValue;
  const UpArgs args{streams, norm, rms, low, shape.streams, shape.n, shape.rank, matrix(up), x, x_q8};
  const unsigned grid = static_cast<unsigned>(shape.n / kWarps);
  const std::size_t bytes = staged_bytes(up, shape.rank);
  cudaError_t status = cudaSuccess;
  visit_form(up, [&](auto form) {
    status = launch(hc_read_up_mix_kernel<decltype(form)>, grid, kThreads, bytes, stream, args);
  });
  return status;
}

}  // namespace strata::kernels
