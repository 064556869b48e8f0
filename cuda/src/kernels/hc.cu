#include "hc.cuh"
#include "hc_gates.cuh"
#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

// Element counts are products of a buffer's dimensions: the buffer lives in VRAM, so they fit a long with room.
unsigned blocks_for(long n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ long element_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }

// No __restrict__: out may alias in.
__global__ void activation_kernel(const float* in, float* out, int n, Activation act, float pre, float post) {
  await_producers();
  release_consumers();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = hc_activation(in[i], act, pre, post);
}

// One thread per element of x [rows][n]; it reads its column of every stream of its row.
__global__ void mix_kernel(const float* __restrict__ up, const float* __restrict__ normed, float* __restrict__ x,
                           int streams, int n, long elements) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at >= elements) return;
  const long first = at / n * streams * n + at % n;  // row r's stream 0, column i
  float sum = 0.0f;
  for (int k = 0; k < streams; ++k) {
    const long from = first + static_cast<long>(k) * n;
    sum = hc_mix_term(up[from], normed[from], sum);
  }
  x[at] = sum / static_cast<float>(streams);
}

// One thread per element of the streams h [rows][streams][n]; a row's y and inj are read by all its streams. Steered:
// then each row's addend (StreamAddend), in a kernel of its own, so that a write without one is the plain kernel as
// it always was. A zero addend is skipped, not added: h + 0 would turn a -0 into +0, and a zero vector is to leave
// every bit of the streams as none does.
template <bool kSteered>
__global__ void write_kernel(float* __restrict__ h, const float* __restrict__ inj, int inj_stride,
                             const float* __restrict__ y, int streams, int n, long elements, StreamAddend add) {
  await_producers();
  release_consumers();
  const long at = element_index();
  if (at >= elements) return;
  const long row = at / (static_cast<long>(streams) * n);
  const int k = static_cast<int>(at / n % streams);
  const int i = static_cast<int>(at % n);
  const float written = fmaf(inj[row * inj_stride + k], y[row * n + i], h[at]);
  if constexpr (!kSteered) {
    h[at] = written;
  } else {
    const float* vector = add.vector;
    if (add.rows) {
      vector = add.rows[row];
      if (vector) vector += add.offset;
    }
    const float a = vector ? vector[i] : 0.0f;
    h[at] = a != 0.0f ? written + a : written;
  }
}

// One thread per element of out [n]: its column of every stream, summed in float64.
__global__ void stream_mean_kernel(const float* __restrict__ h, int streams, int n, float* out) {
  await_producers();
  release_consumers();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double sum = 0.0;
  for (int k = 0; k < streams; ++k) sum += h[static_cast<long>(k) * n + i];
  out[i] = static_cast<float>(sum / streams);
}

}  // namespace

cudaError_t scaled_activation(const float* in, float* out, int n, Activation act, float pre, float post,
                              cudaStream_t stream) {
  if (n <= 0 || (act != Activation::Sigmoid && act != Activation::Silu)) return cudaErrorInvalidValue;
  return launch(activation_kernel, blocks_for(n), kThreads, 0, stream, in, out, n, act, pre, post);
}

cudaError_t hc_mix(const float* up, const float* normed, float* x, int rows, int streams, int n,
                   cudaStream_t stream) {
  if (rows <= 0 || streams <= 0 || n <= 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(rows) * n;
  return launch(mix_kernel, blocks_for(elements), kThreads, 0, stream, up, normed, x, streams, n, elements);
}

cudaError_t hc_write(float* h, const float* inj, int inj_stride, const float* y, int rows, int streams, int n,
                     cudaStream_t stream, StreamAddend add) {
  if (rows <= 0 || streams <= 0 || n <= 0 || inj_stride < 0 || add.offset < 0) return cudaErrorInvalidValue;
  const long elements = static_cast<long>(rows) * streams * n;
  auto* kernel = add.empty() ? write_kernel<false> : write_kernel<true>;
  return launch(kernel, blocks_for(elements), kThreads, 0, stream, h, inj, inj_stride, y, streams, n, elements, add);
}

cudaError_t hc_stream_mean(const float* h, int streams, int n, float* out, cudaStream_t stream) {
  if (streams <= 0 || n <= 0) return cudaErrorInvalidValue;
  return launch(stream_mean_kernel, blocks_for(n), kThreads, 0, stream, h, streams, n, out);
}

}  // namespace strata::kernels
