#include "program_inputs.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "../../kernels/rope.cuh"
#include "../products/mixer_shapes.hpp"
#include "scratch_carver.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

kernels::EmbedTable embed_table(const DeviceTensor& t) {
  kernels::EmbedTable table;
  table.rows = static_cast<int>(t.rows);
  table.cols = static_cast<int>(t.cols);
  if (t.is_float) {
    table.kind = t.float_kind == FloatKind::F32   ? kernels::EmbedKind::F32
                 : t.float_kind == FloatKind::F16 ? kernels::EmbedKind::F16
                                                  : kernels::EmbedKind::BF16;
    table.data = t.data;
    return table;
  }
  const QuantForm& f = t.form;
  const bool q8_0 = f.code_bits == 8 && f.code_bias == 128 && f.codebook == Codebook::None && f.group_size == 32 &&
                    f.super_size == 32 && !f.scale_f32 && !f.has_sub_scales && !f.has_mins;
  STRATA_EXPECTS(q8_0, InvalidArgument,
                 "token_embd.weight: the GPU embedding gather reads F32, F16, BF16 or Q8_0 rows; this file's type "
                 "is another quantized form (requantize token_embd to Q8_0)");
  table.kind = kernels::EmbedKind::Q8_0;
  table.data = t.planes.codes;
  table.d = static_cast<const __half*>(t.planes.d);
  return table;
}

// The RoPE tables' halves, carved out of `c`: the one definition the allocation and bytes() both read.
void carve_rope(Carver& c, const ModelGeometry& g, int context, float** cos, float** sin) {
  const std::size_t floats = static_cast<std::size_t>(context) * std::max(g.rope_dim / 2, 1);
  *cos = c.take<float>(floats);
  *sin = c.take<float>(floats);
}

}  // namespace

std::size_t ProgramTables::bytes(const ModelGeometry& g, int context) {
  Carver sizing(nullptr);
  float *cos = nullptr, *sin = nullptr;
  carve_rope(sizing, g, context, &cos, &sin);
  return sizing.used();
}

ProgramTables::ProgramTables(const DeviceWeights& weights, const ModelGeometry& g, int context)
    : t_(resolve_tensors(weights, g)),
      embedding_(embed_table(*t_.embedding)),
      attention_(attention_shape(g)),
      rope_(0) {
  STRATA_EXPECTS(g.attention_layers() == 0 || kernels::attention_decode_fits(attention_), InvalidArgument,
                 "attention: " + std::to_string(g.n_head / std::max(g.n_head_kv, 1)) + " query heads per KV head of " +
                     std::to_string(g.head_dim) + " dims exceed the decode kernel's shared memory and registers");
  const std::size_t total = bytes(g, context);
  require_free_memory(total, weights.device(), "the RoPE tables would", "a shorter context needs less");
  rope_ = DeviceBuffer(total);
  Carver real(rope_.as<char>());
  carve_rope(real, g, context, &cos_, &sin_);
  const int rope_half = g.rope_dim / 2;
  if (rope_half > 0) {  // built in float64 on the host
    std::vector<float> cos(static_cast<std::size_t>(context) * rope_half), sin(cos.size());
    kernels::build_rope_tables(cos.data(), sin.data(), context, g.rope_dim, g.rope_theta);
    STRATA_CUDA_TRY(cudaMemcpy(cos_, cos.data(), sizeof(float) * cos.size(), cudaMemcpyHostToDevice));
    STRATA_CUDA_TRY(cudaMemcpy(sin_, sin.data(), sizeof(float) * sin.size(), cudaMemcpyHostToDevice));
  }
}

ProgramInputs ProgramTables::inputs(const Sequence& sequence) const {
  ProgramInputs in;
  in.tensors = &t_;
  in.embedding = embedding_;
  in.attention = attention_;
  in.rope_cos = cos_;
  in.rope_sin = sin_;
  in.sequence = sequence.views();
  in.layout = &sequence.layout();
  in.history = sequence.history();
  in.steering = &sequence.steering();
  return in;
}

}  // namespace strata
