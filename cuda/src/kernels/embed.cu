#include <cuda_bf16.h>
#include <math.h>

#include "embed.cuh"
#include "launch.cuh"

namespace strata::kernels {
namespace {

constexpr int kEmbedThreads = 256;

__global__ void embed_rows_kernel(EmbedTable table, const int* __restrict__ ids, float* __restrict__ out) {
  await_producers();
  release_consumers();
  const int id = ids[blockIdx.x];
  const long cols = table.cols;
  float* dst = out + blockIdx.x * cols;
  if (id < 0 || id >= table.rows) {
    for (long i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = NAN;
    return;
  }
  const long base = static_cast<long>(id) * cols;
  for (long i = threadIdx.x; i < cols; i += blockDim.x) {
    float v;
    switch (table.kind) {
      case EmbedKind::F32: v = static_cast<const float*>(table.data)[base + i]; break;
      case EmbedKind::F16: v = __half2float(static_cast<const __half*>(table.data)[base + i]); break;
      case EmbedKind::BF16: v = __bfloat162float(static_cast<const __nv_bfloat16*>(table.data)[base + i]); break;
      default: {
        const int code = static_cast<const unsigned char*>(table.data)[base + i];
        v = __half2float(table.d[(base + i) / 32]) * static_cast<float>(code - 128);
      }
    }
    dst[i] = v;
  }
}

}  // namespace

cudaError_t embed_rows(const EmbedTable& table, const int* ids, int n_ids, float* out, cudaStream_t stream) {
  if (n_ids <= 0 || table.rows <= 0 || table.cols <= 0 || table.data == nullptr ||
      (table.kind == EmbedKind::Q8_0 && (table.cols % 32 != 0 || table.d == nullptr)))
    return cudaErrorInvalidValue;
  return launch(embed_rows_kernel, n_ids, kEmbedThreads, 0, stream, table, ids, out);
}

}  // namespace strata::kernels
