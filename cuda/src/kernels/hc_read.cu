#include "hc_read.cuh"

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

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

// This slot's part of row `row`'s dot with the activation (the caller sums the slots): its q8_32 form for a
// quantized weight, its floats for a float one, staged in shared memory (SharedQ8, SharedF32) or in global
// memory (GlobalQ8, GlobalF32).
template <class F, class Q8, class F32>
__device__ __forceinline__ float row_dot(const Matrix& m, long row, int cols, int slot, int slots, const Q8& q8,
                                         const F32& f32) {
  if constexpr (kQuantRows<F>) {
    return quant_row_partial<typename F::Shape>(m.planes, row, true, cols, m.code_bias, m.book, q8, slot, slots);
  } else {
    using T = typename F::Element;
    return float_row_partial<T, F::kVec>(static_cast<const T*>(m.data) + row * cols, cols, f32, slot, slots);
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

// The streams and where hc_read_stage leaves Hn for the down launches: float32 where a float weight reads it,
// q8_32 where a quantized one does.
struct StageArgs {
  const float* streams;
  const float* norm;
  int hc, n;
  float eps;
  float* hn;
  Q8Blocks hn_q8;
  float* rms;
  const char* weights[2];  // the bulk of the down launches' weight bytes (codes, or a float form's elements),
  long weight_bytes[2];    // which the stage asks L2 for while it reduces and quantizes
};

struct DownArgs {
  const float* hn;
  Q8Blocks hn_q8;
  int hc, n;
  DownPart part[2];  // the launch's rows: part[0]'s, then part[1]'s
};

// Each stream's inverse RMS into inv_rms[hc], reduced in the same order by every CTA (so every CTA's Hn is the
// one hc_read_up_mix rebuilds from rms). A warp walks its blocks in order, so it meets each stream once.
__device__ __forceinline__ void inverse_rms(const StageArgs& a, float* inv_rms) {
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

// Hn = the grouped RMSNorm of the streams, made once for every CTA of the down launches: warp w of CTA c makes
// block 32c + w, its floats and its q8_32 form as norm.cu's grouped rms_norm and quantize_q8_32 make them. Every
// CTA reduces the streams' RMS itself (they are 40 KB in L2 at the released width): no launch waits for another.
__global__ void __launch_bounds__(kThreads) hc_read_stage_kernel(StageArgs a) {
  await_producers();
  release_consumers();
  __shared__ float inv_rms[kMaxStreams];
  const int thread = blockIdx.x * blockDim.x + threadIdx.x, threads = gridDim.x * blockDim.x;
  for (int w = 0; w < 2; ++w) prefetch(a.weights[w], a.weight_bytes[w], thread, threads);
  inverse_rms(a, inv_rms);
  if (blockIdx.x == 0 && threadIdx.x < a.hc) a.rms[threadIdx.x] = inv_rms[threadIdx.x];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, block = blockIdx.x * kWarps + warp;
  if (block >= a.hc * a.n / kCodeBlock) return;  // alike for the whole warp: store_q8_32's shuffles see every lane
  const int i = block * kCodeBlock + lane;
  const float v = a.streams[i] * inv_rms[i / a.n] * a.norm[i];
  if (a.hn) a.hn[i] = v;
  store_q8_32(v, a.hn_q8, i);
}

// kDownRows rows per CTA, kWarpsPerRow warps a row, reading Hn from global memory (L2: hc_read_stage just wrote
// it) as the GEMVs read their activations.
template <class F>
__global__ void __launch_bounds__(kThreads) hc_read_down_kernel(DownArgs a) {
  await_producers();
  release_consumers();
  __shared__ float row_partial[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, width = a.hc * a.n;
  const int row = blockIdx.x * kDownRows + warp / kWarpsPerRow;  // in the launch: part[0]'s rows, then part[1]'s
  const bool first_part = row < a.part[0].rows;
  const DownPart& part = a.part[first_part ? 0 : 1];
  const int part_row = first_part ? row : row - a.part[0].rows;
  const bool live = part_row < part.rows;
  const int slot = warp % kWarpsPerRow * 32 + lane, slots = kWarpsPerRow * 32;
  const GlobalQ8 q8{a.hn_q8.xq, a.hn_q8.dx, a.hn_q8.sums};
  float acc = live ? row_dot<F>(part.m, part_row, width, slot, slots, q8, GlobalF32{a.hn}) : 0.0f;
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

  float up = row_dot<F>(a.up, row, a.rank, slot, lanes, SharedQ8{s.xq, s.dx, s.sums}, SharedF32{s.x});
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

// Where the bulk of `w`'s rows x cols weight bytes lie: a quantized form's codes, a float form's elements.
std::pair<const char*, long> bulk_bytes(const WeightMatrix& w, int rows, int cols) {
  if (!w.is_float) {
    return {reinterpret_cast<const char*>(w.planes.codes), static_cast<long>(rows) * cols * w.form.code_bits / 8};
  }
  const long element = w.kind == FloatKind::F32 ? 4 : 2;
  return {static_cast<const char*>(w.data), static_cast<long>(rows) * cols * element};
}

// One hc_read_down launch over args' parts, all of `w`'s form.
cudaError_t launch_down(const WeightMatrix& w, DownArgs args, cudaStream_t stream) {
  const int rows = args.part[0].rows + args.part[1].rows;
  const unsigned grid = static_cast<unsigned>((rows + kDownRows - 1) / kDownRows);
  cudaError_t status = cudaSuccess;
  visit_form(w, [&](auto form) {
    status = launch(hc_read_down_kernel<decltype(form)>, grid, kThreads, 0, stream, args);
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
                         const WeightMatrix* inject, const HcReadStage& stage, float* low, float* inj, float* rms,
                         cudaStream_t stream) {
  const int width = shape.streams * shape.n;
  if (!shape_fits(shape) || !weight_fits(down, width) || (inject && (!inj || !weight_fits(*inject, width))) || !rms)
    return cudaErrorInvalidValue;
  const bool reads_floats = down.is_float || (inject && inject->is_float);
  const bool reads_q8 = !down.is_float || (inject && !inject->is_float);
  if ((reads_floats && !stage.hn) || (reads_q8 && !stage.hn_q8.xq)) return cudaErrorInvalidValue;
  StageArgs staged{streams, norm, shape.streams, shape.n, shape.eps, reads_floats ? stage.hn : nullptr,
                   reads_q8 ? stage.hn_q8 : Q8Blocks{}, rms, {}, {}};
  const WeightMatrix* read[2] = {&down, inject};
  for (int w = 0; w < 2; ++w) {
    if (read[w]) std::tie(staged.weights[w], staged.weight_bytes[w]) = bulk_bytes(*read[w], w == 0 ? shape.rank :
                                                                                    shape.streams, width);
  }
  const unsigned stage_grid = static_cast<unsigned>((width / kCodeBlock + kWarps - 1) / kWarps);
  const cudaError_t staging = launch(hc_read_stage_kernel, stage_grid, kThreads, 0, stream, staged);
  if (staging != cudaSuccess) return staging;
  DownArgs args{staged.hn, staged.hn_q8, shape.streams, shape.n, {}};
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
