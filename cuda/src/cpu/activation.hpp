// The activations the row kernels read, and q8_32 activation quantization (docs/forms.md "Activation
// contract") into pool-owned buffers.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::cpu {

// Views into scratch for one quantized vector of `cols` (a multiple of 32) elements.
struct QuantizedVector {
  int8_t* xq = nullptr;   // [cols]
  float* dx = nullptr;    // [cols / 32] block scale
  float* dx16 = nullptr;  // [cols / 16] the block scale of each 16-element group (dx repeated)
  float* xs16 = nullptr;  // [cols / 16] dx * Σ xq over each 16-element group
  float* xs32 = nullptr;  // [cols / 32] dx * Σ xq over each block
};

// Owns the buffers of `rows` quantized vectors of `cols` elements each, row after row.
struct QuantizedRows {
  int64_t cols;
  std::vector<int8_t> xq;
  std::vector<float> dx, dx16, xs16, xs32;

  QuantizedRows(int64_t rows, int64_t cols_)
      : cols(cols_), xq(rows * cols_), dx(rows * cols_ / 32), dx16(rows * cols_ / 16), xs16(rows * cols_ / 16),
        xs32(rows * cols_ / 32) {}

  QuantizedVector row(int64_t r) {
    return {xq.data() + r * cols, dx.data() + r * cols / 32, dx16.data() + r * cols / 16, xs16.data() + r * cols / 16,
            xs32.data() + r * cols / 32};
  }
};

// One activation as the row kernels take it: float forms dot the float32 vector itself, quantized forms its
// q8_32. A layer fills `q` only when one of the matrices that read this activation is quantized.
struct Activation {
  const float* f32 = nullptr;  // [cols]
  QuantizedVector q;
};

// Quantizes blocks [block0, block1) of x into q. Bit-identical to strata.quant.quantize_activation: the
// scale is max|x| / 127 and each element is divided (not multiplied by a reciprocal) before rounding.
void quantize_blocks(const float* x, int64_t block0, int64_t block1, const QuantizedVector& q);

}  // namespace strata::cpu
