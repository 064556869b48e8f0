// Token embedding row gather: float rows or Q8_0-form rows (docs/forms.md) to float32.
// Token ids come from device memory; the launcher never allocates, synchronises or throws.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace strata::kernels {

enum class EmbedKind : int { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

struct EmbedTable {
  EmbedKind kind = EmbedKind::F32;
  int rows = 0;
  int cols = 0;                  // Q8_0: a multiple of 32
  const void* data = nullptr;    // float kinds: [rows][cols]; Q8_0: uint8 codes [rows][cols], value = code - 128
  const __half* d = nullptr;     // Q8_0 only: [rows][cols / 32] scales
};

// out[i, :] = row ids[i] of the table, for i < n_ids. An id outside [0, rows) gives a row of NaN, so a bad id
// is visible downstream instead of reading out of bounds.
cudaError_t embed_rows(const EmbedTable& table, const int* ids, int n_ids, float* out, cudaStream_t stream);

}  // namespace strata::kernels
