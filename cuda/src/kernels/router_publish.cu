#include "doorbell_ring.cuh"
#include "gemv.cuh"
#include "gemv_float_rows.cuh"
#include "gemv_quant_rows.cuh"
#include "gemv_rows.cuh"
#include "launch.cuh"
#include "quant_shapes.cuh"
#include "reduce.cuh"
#include "route_select.cuh"
#include "router_publish.cuh"

namespace strata::kernels {
namespace {

// A float router's rows, as gemv_float_kernel reads them.
template <class T, int Vec>
struct FloatRouterRows {
  const T* w;
  int cols;
  const float* x;
  __device__ __forceinline__ float partial(int row, int rows, int part, int split, int lane) const {
    if (row >= rows) return 0.0f;
    return float_row_partial<T, Vec>(w + static_cast<long>(row) * cols, cols, GlobalF32{x}, part * 32 + lane,
                                     32 * split);
  }
};

// A quantized router's rows, as gemv_quant_kernel reads them (a spare warp reads the last row's address, no
// blocks).
template <class S>
struct QuantRouterRows {
  QuantPlanes planes;
  int cols;
  int code_bias;
  ValueTable book;
  const std::int8_t* xq;
  const float* dx;
  const std::int32_t* sums;
  __device__ __forceinline__ float partial(int row, int rows, int part, int split, int lane) const {
    const bool live = row < rows;
    return quant_row_partial<S>(planes, live ? row : rows - 1, live, cols, code_bias, book, GlobalQ8{xq, dx, sums},
                                part * 32 + lane, 32 * split);
  }
};

template <class Rows>
__global__ void __launch_bounds__(kRowsPerCta * 32)
route_publish_kernel(Rows rows, int n_expert, const float* __restrict__ x, int k, RouteTargets out,
                     RoutePublish publish, int split) {
  await_producers();
  release_consumers();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (kRowsPerCta / split) + warp / split;
  const float acc = warp_sum(rows.partial(row, n_expert, warp % split, split, lane));
  store_row(acc, row, n_expert, warp, lane, split, out.logits);
  if (publish.ring) publish_x(publish.bell, x, publish.bell.n, blockIdx.x * blockDim.x + threadIdx.x,
                                     gridDim.x * blockDim.x);
  // Release: this CTA's logits (and its share of x, system-wide) before its ticket, so the CTA that draws the
  // last ticket reads every row, and its ring follows every copy of x.
  if (publish.ring) __threadfence_system();
  else __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(out.ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();  // acquire: the other CTAs' rows are read after their tickets were seen
  int id = 0;
  float weight = 0.0f;
  route_top_k(out.logits, n_expert, k, lane, id, weight);
  if (lane < k) {
    out.ids[lane] = id;
    out.weights[lane] = weight;
    if (out.slot_of) out.slots[lane] = out.slot_of[id];
    if (publish.ring) {
      publish.bell.ids[lane] = id;
      publish.bell.weights[lane] = weight;
    }
  }
  if (lane == 0) *out.ticket = 0;  // the next launch, or a graph's replay, counts from zero again
  if (!publish.ring) return;
  __threadfence_system();
  __syncwarp();
  if (lane == 0) ring_doorbell(publish.bell, publish.ring_base, publish.ring_offset);
}

bool valid_targets(const RouterMatrix& w, const RouterInput& x, int k, const RouteTargets& out,
                   const RoutePublish& publish) {
  if (!route_shape_fits(w.n_expert, k) || w.cols <= 0 || x.x == nullptr) return false;
  if (out.logits == nullptr || out.ids == nullptr || out.weights == nullptr || out.ticket == nullptr) return false;
  if (out.slot_of != nullptr && out.slots == nullptr) return false;
  if (!w.matrix.is_float && (x.xq == nullptr || x.dx == nullptr || x.sums == nullptr)) return false;
  if (!publish.ring) return true;
  const Doorbell& b = publish.bell;
  return b.n == w.cols && b.k == k && b.x != nullptr && b.ids != nullptr && b.weights != nullptr &&
         b.seq != nullptr && publish.ring_base != nullptr;
}

}  // namespace

cudaError_t route_publish(const RouterMatrix& w, const RouterInput& x, int k, const RouteTargets& out,
                          const RoutePublish& publish, cudaStream_t stream) {
  if (!valid_targets(w, x, k, out, publish)) return cudaErrorInvalidValue;
  // The GEMV's own spread of rows over CTAs and warps: the same partial sums in the same order, the same bits.
  const int split = row_split(w.n_expert);
  const dim3 grid = gemv_grid(w.n_expert, split, 1);
  cudaError_t status = cudaSuccess;
  auto run = [&](auto rows) {
    status = launch(route_publish_kernel<decltype(rows)>, grid, kRowsPerCta * 32, 0, stream, rows, w.n_expert, x.x, k,
                    out, publish, split);
  };
  bool known = false;
  const WeightMatrix& m = w.matrix;
  if (!m.is_float) {
    const cudaError_t operands = gemv_quant_operands(m.form, m.planes, w.n_expert, w.cols, x.xq);
    if (operands != cudaSuccess) return operands;
    const ValueTable book = value_table(codebook_values(m.form.codebook));
    known = KnownShapes::visit(m.form, [&](auto shape) {
      run(QuantRouterRows<decltype(shape)>{m.planes, w.cols, m.form.code_bias, book, x.xq, x.dx, x.sums});
    });
  } else {
    known = visit_float_rows(m.kind, m.data, w.cols, 0, x.x, [&](auto path) {
      using P = decltype(path);
      using T = typename P::Element;
      run(FloatRouterRows<T, P::kVec>{static_cast<const T*>(m.data), w.cols, x.x});
    });
  }
  return known ? status : cudaErrorInvalidValue;
}

}  // namespace strata::kernels
