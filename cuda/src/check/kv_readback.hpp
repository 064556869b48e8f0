// The attention checks' reading of a paged KV cache half back to the host: kernels/kv.cuh's format written out
// once more, host-side, so a test sees the cache as stored. Private to strata_check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_mixers.hpp"
#include "strata/kv_format.hpp"

namespace strata::kernel_check::support {

// Element `at` of one half of the cache read back as bytes.
inline float dequant_cell(const std::vector<unsigned char>& bytes, KvCodes codes, std::size_t elements,
                          std::size_t at) {
  if (codes == KvCodes::Bf16) {
    __nv_bfloat16 b;
    std::memcpy(&b, bytes.data() + at * 2, 2);
    return __bfloat162float(b);
  }
  __half scale;
  std::memcpy(&scale, bytes.data() + kv_code_bytes(codes, elements) + at / kKvGroup * sizeof(__half), sizeof(__half));
  const float d = __half2float(scale);
  if (codes == KvCodes::Int8) return d * static_cast<signed char>(bytes[at]);
  const unsigned pair = bytes[at / 2];
  return d * (static_cast<int>(at % 2 ? pair >> 4 : pair & 15u) - 8);
}

// Dequantizes tokens 0..steps-1 of a half read back as bytes into dst [Hkv][steps][d].
inline void dequant_cache(const std::vector<unsigned char>& bytes, KvCodes codes, std::size_t elements,
                          const AttentionCheckShape& s, int steps, const int* page_order, float* dst) {
  for (int j = 0; j < s.n_head_kv; ++j)
    for (int t = 0; t < steps; ++t) {
      const std::size_t row =
          (static_cast<std::size_t>(page_order[t / s.page_size]) * s.n_head_kv + j) * s.page_size + t % s.page_size;
      for (int i = 0; i < s.head_dim; ++i)
        dst[(static_cast<std::size_t>(j) * steps + t) * s.head_dim + i] =
            dequant_cell(bytes, codes, elements, row * s.head_dim + i);
    }
}

// Reads a poisoned, guarded half of the cache back and dequantizes tokens 0..steps-1 into [Hkv][steps][d].
inline void read_cache(const GuardedOutput& half, KvCodes codes, std::size_t elements, const AttentionCheckShape& s,
                       int steps, const int* page_order, float* dst, const char* what) {
  std::vector<unsigned char> bytes(kv_half_bytes(codes, elements));
  half.copy_out(bytes.data(), what);
  dequant_cache(bytes, codes, elements, s, steps, page_order, dst);
}

}  // namespace strata::kernel_check::support
