// The tensor-core instructions and the asynchronous copies that the kernels on the tensor cores share: the
// matrix products (matmul_tiles.cuh) and the multi-input GEMV of a step's rows (gemv_quant_mma.cu). Fragment
// layouts as the PTX ISA states them ("Matrix Fragments for mma.m16n8k*"): lane = 4 g + t holds an m16n8
// accumulator's weight rows g and g + 8 at columns 2 t and 2 t + 1.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels {

// D += A B on int8 tensor cores: A 16 x 32 (row-major fragment, 4 words), B 32 x 8 (column-major, 2 words).
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A B over 16 columns: A 16 x 16 (2 words), B 16 x 8 (1 word).
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], unsigned a0, unsigned a1, unsigned b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// D += A B on bf16 tensor cores with float32 accumulation: A 16 x 16 (4 words of bf16 pairs), B 16 x 8 (2 words).
__device__ __forceinline__ void mma_bf16_k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Asynchronous global -> shared copies of Bytes (4, 8 or 16) bytes, both addresses aligned to Bytes.
template <int Bytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(to), "l"(global), "n"(Bytes) : "memory");
  }
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `Pending` of this thread's committed copy groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

}  // namespace strata::kernels
